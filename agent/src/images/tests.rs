#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use super::*;

const MIB: u64 = 1024 * 1024;

/// A runtime whose image filesystem holds its images plus `other` bytes.
#[derive(Default)]
struct FakeRuntime {
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    images: Vec<ImageInfo>,
    in_use: HashSet<String>,
    capacity: u64,
    other: u64,
    removed: Vec<String>,
    refuse_removal: HashSet<String>,
    device: u64,
}

impl FakeRuntime {
    fn new(capacity: u64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(FakeState {
                capacity,
                ..FakeState::default()
            }),
        })
    }

    fn add(&self, id: &str, size: u64) {
        self.add_image(id, size, false);
    }

    fn add_image(&self, id: &str, size: u64, pinned: bool) {
        self.state.lock().unwrap().images.push(ImageInfo {
            id: id.to_owned(),
            size,
            pinned,
        });
    }

    fn use_image(&self, id: &str, used: bool) {
        let mut state = self.state.lock().unwrap();
        if used {
            state.in_use.insert(id.to_owned());
        } else {
            state.in_use.remove(id);
        }
    }

    fn fill(&self, other: u64) {
        self.state.lock().unwrap().other = other;
    }

    fn removed(&self) -> Vec<String> {
        self.state.lock().unwrap().removed.clone()
    }
}

#[async_trait]
impl ImageGcRuntime for FakeRuntime {
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError> {
        Ok(self.state.lock().unwrap().images.clone())
    }

    async fn images_in_use(&self) -> Result<HashSet<String>, ImageGcError> {
        Ok(self.state.lock().unwrap().in_use.clone())
    }

    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError> {
        let mut state = self.state.lock().unwrap();
        if state.refuse_removal.contains(id) {
            return Err(ImageGcError::NoImageFs);
        }
        state.images.retain(|image| image.id != id);
        state.removed.push(id.to_owned());
        Ok(())
    }

    async fn image_fs(&self) -> Result<FsCapacity, ImageGcError> {
        let state = self.state.lock().unwrap();
        let used = state.other + state.images.iter().map(|i| i.size).sum::<u64>();
        Ok(FsCapacity {
            capacity: state.capacity,
            available: state.capacity.saturating_sub(used),
        })
    }

    async fn image_fs_device(&self) -> Result<u64, ImageGcError> {
        Ok(self.state.lock().unwrap().device)
    }
}

fn policy() -> ImageGcPolicy {
    ImageGcPolicy::from(&ImageGcSettings::default())
}

fn gc_manager(runtime: &Arc<FakeRuntime>, policy: ImageGcPolicy) -> (ImageGcManager, Recorder) {
    let recorder = Recorder::new(None);
    let runtime: Arc<dyn ImageGcRuntime> = runtime.clone();
    let manager = ImageGcManager::new(runtime, policy, recorder.clone(), "node-a".to_owned());
    (manager, recorder)
}

fn reasons(recorder: &Recorder) -> Vec<String> {
    recorder.recent().into_iter().map(|e| e.reason).collect()
}

#[tokio::test(start_paused = true)]
async fn under_the_high_threshold_nothing_is_removed() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("old", 10 * MIB);
    runtime.fill(74 * MIB);
    let (mut manager, recorder) = gc_manager(&runtime, policy());
    manager.round().await;
    assert!(runtime.removed().is_empty());
    assert!(reasons(&recorder).is_empty());
}

#[tokio::test(start_paused = true)]
async fn over_the_threshold_unused_images_go_least_recently_used_first_down_to_the_low_one() {
    let runtime = FakeRuntime::new(100 * MIB);
    for id in ["used-first", "used-last", "never-used", "running", "pause"] {
        runtime.add_image(id, 5 * MIB, id == "pause");
    }
    runtime.use_image("running", true);
    let (mut manager, recorder) = gc_manager(&runtime, policy());
    manager.round().await;

    runtime.use_image("used-first", true);
    tokio::time::advance(Duration::from_mins(5)).await;
    manager.round().await;
    runtime.use_image("used-first", false);
    runtime.use_image("used-last", true);
    tokio::time::advance(Duration::from_mins(5)).await;
    manager.round().await;
    runtime.use_image("used-last", false);
    assert!(runtime.removed().is_empty(), "25% used: nothing to do");

    // 86% used: 6 MiB must go to reach 80%, more than one image's 5 MiB.
    runtime.fill(61 * MIB);
    tokio::time::advance(Duration::from_mins(5)).await;
    manager.round().await;
    assert_eq!(runtime.removed(), ["never-used", "used-first"]);
    assert!(reasons(&recorder).is_empty(), "{:?}", recorder.recent());
}

#[tokio::test(start_paused = true)]
async fn images_younger_than_the_minimum_age_stay_and_those_found_at_start_do_not_count_as_young() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("at-start", 10 * MIB);
    let (mut manager, _) = gc_manager(&runtime, policy());
    manager.round().await;
    runtime.add("pulled", 10 * MIB);
    runtime.fill(75 * MIB);
    tokio::time::advance(Duration::from_mins(1)).await;
    manager.round().await;
    assert_eq!(runtime.removed(), ["at-start"]);

    // Detected just now: younger than imageMinimumGCAge (2m) until two minutes later.
    runtime.fill(85 * MIB);
    tokio::time::advance(Duration::from_secs(119)).await;
    manager.round().await;
    assert_eq!(runtime.removed(), ["at-start"]);
    tokio::time::advance(Duration::from_secs(1)).await;
    manager.round().await;
    assert_eq!(runtime.removed(), ["at-start", "pulled"]);
}

#[tokio::test(start_paused = true)]
async fn too_little_to_free_is_reported_and_a_repeated_failure_is_an_event() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("running", 10 * MIB);
    runtime.add("unused", 2 * MIB);
    runtime.use_image("running", true);
    runtime.fill(80 * MIB);
    let (mut manager, recorder) = gc_manager(&runtime, policy());
    manager.round().await;
    assert_eq!(runtime.removed(), ["unused"]);
    assert_eq!(reasons(&recorder), [FREE_DISK_SPACE_FAILED]);
    let event = &recorder.recent()[0];
    assert_eq!(
        event.message,
        format!(
            "Failed to garbage collect required amount of images. Attempted to free {} bytes, \
             but only found {} bytes eligible to free.",
            12 * MIB,
            2 * MIB
        )
    );
    assert_eq!(event.object, EventObject::node("node-a").to_string());

    manager.round().await;
    assert_eq!(
        reasons(&recorder),
        [
            FREE_DISK_SPACE_FAILED,
            FREE_DISK_SPACE_FAILED,
            IMAGE_GC_FAILED
        ],
        "the second failure in a row is an ImageGCFailed event"
    );
    runtime.fill(0);
    manager.round().await;
    manager.round().await;
    assert_eq!(reasons(&recorder).len(), 3, "success resets the streak");
}

#[tokio::test(start_paused = true)]
async fn a_failed_removal_does_not_stop_the_others() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("stuck", 5 * MIB);
    runtime.add("b", 5 * MIB);
    runtime.add("c", 5 * MIB);
    runtime
        .state
        .lock()
        .unwrap()
        .refuse_removal
        .insert("b".to_owned());
    runtime.fill(75 * MIB);
    let (mut manager, _) = gc_manager(&runtime, policy());
    manager.detect(None).await.unwrap();
    let err = manager.garbage_collect().await.unwrap_err();
    assert!(
        matches!(err, ImageGcError::Removals { failed: 1, .. }),
        "{err:?}"
    );
    assert_eq!(runtime.removed(), ["c", "stuck"]);
}

#[tokio::test(start_paused = true)]
async fn past_the_maximum_age_unused_images_go_whatever_the_usage() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("idle", MIB);
    runtime.add("running", MIB);
    runtime.use_image("running", true);
    let (mut manager, _) = gc_manager(
        &runtime,
        ImageGcPolicy {
            maximum_age: Duration::from_mins(30),
            ..policy()
        },
    );
    manager.round().await;
    tokio::time::advance(Duration::from_mins(30)).await;
    manager.round().await;
    assert!(
        runtime.removed().is_empty(),
        "not before the agent has been collecting for imageMaximumGCAge"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    manager.round().await;
    assert_eq!(runtime.removed(), ["idle"]);
}

#[tokio::test(start_paused = true)]
async fn a_zero_capacity_is_an_invalid_disk_capacity_event() {
    let runtime = FakeRuntime::new(0);
    let (mut manager, recorder) = gc_manager(&runtime, policy());
    manager.round().await;
    assert_eq!(reasons(&recorder), [INVALID_DISK_CAPACITY]);
}

#[tokio::test(start_paused = true)]
async fn the_manager_collects_every_period_and_not_at_all_when_off() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("old", 10 * MIB);
    let (manager, _) = gc_manager(&runtime, policy());
    let task = tokio::spawn(manager.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.removed().is_empty());
    runtime.fill(80 * MIB);
    tokio::time::sleep(Duration::from_mins(4)).await;
    assert!(
        runtime.removed().is_empty(),
        "the next round is 5 minutes after the first"
    );
    tokio::time::sleep(Duration::from_mins(1)).await;
    assert_eq!(runtime.removed(), ["old"]);
    task.abort();

    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("old", 10 * MIB);
    runtime.fill(89 * MIB);
    let (manager, _) = gc_manager(
        &runtime,
        ImageGcPolicy {
            high_threshold_percent: 100,
            low_threshold_percent: 0,
            ..policy()
        },
    );
    let task = tokio::spawn(manager.run());
    tokio::time::sleep(Duration::from_hours(1)).await;
    assert!(runtime.removed().is_empty());
    task.abort();
}

fn off() -> ImageGcPolicy {
    ImageGcPolicy {
        high_threshold_percent: 100,
        low_threshold_percent: 0,
        ..policy()
    }
}

#[tokio::test(start_paused = true)]
async fn eviction_deletes_unused_images_old_enough_whatever_the_usage_even_with_collection_off() {
    let runtime = FakeRuntime::new(100 * MIB);
    runtime.add("old", 10 * MIB);
    runtime.add("running", 5 * MIB);
    runtime.add_image("pause", MIB, true);
    runtime.use_image("running", true);
    let (manager, _) = gc_manager(&runtime, off());
    let handle = manager.handle(PathBuf::from("/"));
    let task = tokio::spawn(manager.run());
    assert_eq!(handle.delete_unused_images().await.unwrap(), 10 * MIB);
    assert_eq!(runtime.removed(), ["old"]);

    runtime.add("pulled", 3 * MIB);
    assert_eq!(
        handle.delete_unused_images().await.unwrap(),
        0,
        "younger than imageMinimumGCAge"
    );
    tokio::time::advance(Duration::from_mins(2)).await;
    assert_eq!(handle.delete_unused_images().await.unwrap(), 3 * MIB);
    assert_eq!(runtime.removed(), ["old", "pulled"]);

    task.abort();
    let _ = task.await;
    assert!(matches!(
        handle.delete_unused_images().await,
        Err(ImageGcError::Stopped)
    ));
}

#[tokio::test]
async fn the_image_filesystem_is_dedicated_when_its_device_is_not_the_root_directorys() {
    let root = tempfile::tempdir().unwrap();
    let root_device = rustix::fs::stat(root.path()).unwrap().st_dev;
    let runtime = FakeRuntime::new(100 * MIB);
    let (manager, _) = gc_manager(&runtime, policy());
    let handle = manager.handle(root.path().to_owned());
    runtime.state.lock().unwrap().device = root_device;
    assert!(!handle.has_dedicated_image_fs().await.unwrap());
    runtime.state.lock().unwrap().device = root_device + 1;
    assert!(handle.has_dedicated_image_fs().await.unwrap());
    let gone = ImageGcHandle {
        root_dir: root.path().join("missing"),
        ..handle
    };
    assert!(matches!(
        gone.has_dedicated_image_fs().await,
        Err(ImageGcError::Stat { .. })
    ));
}
