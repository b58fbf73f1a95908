//! Image garbage collection (the kubelet's `pkg/kubelet/images/image_gc_manager.go`,
//! `realImageGCManager`, run as its `StartGarbageCollection` does): every `imageGCPeriod` (the
//! kubelet's fixed 5 minutes) the images on the node are detected, each with the time it was
//! first detected and the time it was last seen used by a container, and:
//!
//! - with `imageMaximumGCAge` set and the agent up that long, every unused image not used for
//!   longer is removed;
//! - when the image filesystem's usage (from CRI `ImageFsInfo`, capacity and free space by
//!   `statvfs` of its mountpoint as cadvisor does) is at or above `imageGCHighThresholdPercent`,
//!   unused images are removed, least recently used first (then first detected first), until
//!   their sizes add up to what brings usage down to `imageGCLowThresholdPercent`. Images detected
//!   less than `imageMinimumGCAge` ago stay: they may have just been pulled for a container.
//!
//! An image is in use while any container the runtime lists, running or not, refers to it; the
//! runtime's sandbox image and images the runtime pins are never removed. Images present when the
//! agent starts count as detected in the unknown past, as the kubelet's initial detection does.
//!
//! Eviction reaches the manager through its [`ImageGcHandle`] to reclaim disk (the kubelet's
//! `DeleteUnusedImages`): every unused image old enough is removed at once, whatever the usage and
//! even when periodic collection is off; and to learn whether the images have a filesystem of
//! their own (`HasDedicatedImageFs`), which decides what disk pressure reclaims.
//!
//! [`ImagePuller`] (in `puller`) limits how many pulls run at once and how often they start.

mod cri;
mod puller;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};

pub use cri::CriImageGcRuntime;
pub use puller::{ImagePuller, PullLimitError, PullPermit};

use crate::apis::config::ImageGcSettings;
use crate::error_chain::error_chain;
use crate::events::{EventObject, EventType, Recorder};
use crate::eviction::ImageReclaimer;
use crate::kuberuntime::CriError;

/// The kubelet's event reasons (`pkg/kubelet/events`).
pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";

/// Why a detection or a collection failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error("listing the images")]
    ListImages(#[source] CriError),
    #[error("listing the containers")]
    ListContainers(#[source] CriError),
    #[error("reading the runtime's sandbox image")]
    SandboxImage(#[source] CriError),
    #[error("removing image {id}")]
    Remove {
        id: String,
        #[source]
        source: CriError,
    },
    #[error("reading the image filesystem's usage")]
    FsInfo(#[source] CriError),
    #[error("the runtime reports no image filesystem")]
    NoImageFs,
    #[error("reading the capacity of {mountpoint}")]
    Statvfs {
        mountpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid capacity 0 on image filesystem")]
    ZeroCapacity,
    #[error("reading the device of {path}")]
    Stat {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the image garbage collector is not running")]
    Stopped,
    #[error(
        "failed to garbage collect required amount of images: attempted to free {wanted} bytes, \
         but only found {freed} bytes eligible to free"
    )]
    NotEnough { wanted: u64, freed: u64 },
    #[error("{failed} of the image removals failed (to free {wanted} bytes, freed {freed})")]
    Removals {
        wanted: u64,
        freed: u64,
        failed: usize,
        #[source]
        first: Box<ImageGcError>,
    },
}

/// One image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The runtime's image id (containerd: `sha256:` and the config's digest).
    pub id: String,
    /// Bytes, as the runtime reports them (containerd: the content's size).
    pub size: u64,
    /// The runtime asks that the image be kept (containerd 1.7: its sandbox image).
    pub pinned: bool,
}

/// Size and free space of the image filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsCapacity {
    pub capacity: u64,
    pub available: u64,
}

/// What image garbage collection asks of the runtime.
#[async_trait]
pub trait ImageGcRuntime: Send + Sync {
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError>;
    /// Image ids that containers (all of them, running or not) and the runtime's sandboxes use.
    async fn images_in_use(&self) -> Result<HashSet<String>, ImageGcError>;
    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError>;
    async fn image_fs(&self) -> Result<FsCapacity, ImageGcError>;
    /// The device (`st_dev`) of the image filesystem.
    async fn image_fs_device(&self) -> Result<u64, ImageGcError>;
}

/// The collection policy (`ImageGCPolicy`), from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    pub high_threshold_percent: u8,
    pub low_threshold_percent: u8,
    pub minimum_age: Duration,
    pub maximum_age: Duration,
    pub period: Duration,
}

impl From<&ImageGcSettings> for ImageGcPolicy {
    fn from(settings: &ImageGcSettings) -> Self {
        Self {
            high_threshold_percent: settings.high_threshold_percent,
            low_threshold_percent: settings.low_threshold_percent,
            minimum_age: settings.minimum_age,
            maximum_age: settings.maximum_age,
            period: settings.period,
        }
    }
}

impl ImageGcPolicy {
    /// Whether nothing can ever be collected: the kubelet then does not start image GC at all.
    pub fn is_off(&self) -> bool {
        self.high_threshold_percent >= 100 && self.maximum_age.is_zero()
    }
}

/// What is known of one image. `None` times lie in the unknown past: detected before the agent
/// started, or never seen used.
#[derive(Debug, Clone, Copy)]
struct ImageRecord {
    first_detected: Option<Instant>,
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
    /// Whether the last detection saw a container use it (only to log when that starts).
    in_use: bool,
}

/// An unused image that may be removed, in eviction order.
#[derive(Debug, Clone)]
struct Candidate {
    id: String,
    record: ImageRecord,
}

/// Why an image is removed (the kubelet's `ImageGarbageCollectedTotal` reasons).
#[derive(Debug, Clone, Copy)]
enum Reason {
    Age,
    Space,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Self::Age => "age",
            Self::Space => "space",
        }
    }
}

/// A request to delete every unused image now, and where its answer goes (the bytes freed).
type DeleteRequest = oneshot::Sender<Result<u64, ImageGcError>>;

/// Owns the image records and collects on its period.
pub struct ImageGcManager {
    runtime: Arc<dyn ImageGcRuntime>,
    requests: mpsc::Receiver<DeleteRequest>,
    /// Kept for [`handle`](Self::handle); as the manager holds one, `requests` never closes.
    request_sender: mpsc::Sender<DeleteRequest>,
    policy: ImageGcPolicy,
    recorder: Recorder,
    node_name: String,
    records: HashMap<String, ImageRecord>,
    /// Whether a detection succeeded: until then images count as detected in the unknown past.
    initialized: bool,
    /// When collection started (`beganGC`): ages only count from then.
    began: Instant,
    previous_failed: bool,
}

impl ImageGcManager {
    pub fn new(
        runtime: Arc<dyn ImageGcRuntime>,
        policy: ImageGcPolicy,
        recorder: Recorder,
        node_name: String,
    ) -> Self {
        // One request at a time is all eviction makes; more wait for room.
        let (request_sender, requests) = mpsc::channel(1);
        Self {
            runtime,
            requests,
            request_sender,
            policy,
            recorder,
            node_name,
            records: HashMap::new(),
            initialized: false,
            began: Instant::now(),
            previous_failed: false,
        }
    }

    /// A handle for eviction; `root_dir` is the agent's root directory, whose filesystem is the
    /// node filesystem.
    pub fn handle(&self, root_dir: PathBuf) -> ImageGcHandle {
        ImageGcHandle {
            requests: self.request_sender.clone(),
            runtime: Arc::clone(&self.runtime),
            root_dir,
        }
    }

    /// Collects now and then every period, for ever, and deletes unused images when a handle
    /// asks; when the policy can never collect anything, only does the latter.
    pub async fn run(mut self) {
        let collecting = !self.policy.is_off();
        if collecting {
            tracing::info!(
                high_threshold_percent = self.policy.high_threshold_percent,
                low_threshold_percent = self.policy.low_threshold_percent,
                minimum_age = ?self.policy.minimum_age,
                maximum_age = ?self.policy.maximum_age,
                period = ?self.policy.period,
                "image garbage collection started"
            );
        } else {
            tracing::info!(
                "imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image garbage \
                 collection is off (eviction still deletes unused images under disk pressure)"
            );
        }
        self.began = Instant::now();
        let mut ticker = tokio::time::interval(self.policy.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick(), if collecting => self.round().await,
                Some(reply) = self.requests.recv() => {
                    // The asker may have given up; the images are gone all the same.
                    let _ = reply.send(self.delete_unused_images().await);
                }
            }
        }
    }

    /// `DeleteUnusedImages`: removes every unused image past the minimum age, least recently
    /// used first. Returns the bytes freed.
    async fn delete_unused_images(&mut self) -> Result<u64, ImageGcError> {
        tracing::info!("attempting to delete unused images");
        if !self.initialized {
            self.detect(None).await?;
            self.initialized = true;
        }
        let free_time = Instant::now();
        let candidates = self.eviction_order(free_time).await?;
        self.free_space(u64::MAX, free_time, &candidates).await
    }

    /// One period: the initial detection while none succeeded, then a collection, with the
    /// kubelet's logging and its event for repeated failures.
    async fn round(&mut self) {
        if !self.initialized {
            match self.detect(None).await {
                Ok(_) => self.initialized = true,
                Err(err) => tracing::info!(error = %error_chain(&err), "failed to monitor images"),
            }
        }
        match self.garbage_collect().await {
            Ok(()) if self.previous_failed => {
                self.previous_failed = false;
                tracing::info!("image garbage collection succeeded");
            }
            Ok(()) => tracing::debug!("image garbage collection succeeded"),
            Err(err) if self.previous_failed => {
                let message = error_chain(&err);
                tracing::error!(error = %message, "image garbage collection failed multiple times in a row");
                self.recorder.event(
                    EventType::Warning,
                    EventObject::node(&self.node_name),
                    IMAGE_GC_FAILED,
                    message,
                );
            }
            Err(err) => {
                self.previous_failed = true;
                tracing::error!(
                    error = %error_chain(&err),
                    "image garbage collection failed once; stats initialization may not have completed yet"
                );
            }
        }
    }

    /// Records the images present, when they were first seen (`detected`; `None` for the unknown
    /// past) and which ones containers use now; forgets images that are gone. Returns the images
    /// in use.
    async fn detect(&mut self, detected: Option<Instant>) -> Result<HashSet<String>, ImageGcError> {
        let images = self.runtime.list_images().await?;
        let in_use = self.runtime.images_in_use().await?;
        let now = Instant::now();
        let mut present = HashSet::with_capacity(images.len());
        for image in images {
            let record = self
                .records
                .entry(image.id.clone())
                .or_insert_with(|| ImageRecord {
                    first_detected: detected,
                    last_used: None,
                    size: 0,
                    pinned: false,
                    in_use: false,
                });
            let used = in_use.contains(&image.id);
            if used {
                if !record.in_use {
                    tracing::debug!(image = %image.id, "image is in use by a container");
                }
                record.last_used = Some(now);
            }
            record.in_use = used;
            record.size = image.size;
            record.pinned = image.pinned;
            present.insert(image.id);
        }
        self.records.retain(|id, _| present.contains(id));
        Ok(in_use)
    }

    /// `GarbageCollect`: images past the maximum age, then space down to the low threshold.
    async fn garbage_collect(&mut self) -> Result<(), ImageGcError> {
        let free_time = Instant::now();
        let candidates = self.eviction_order(free_time).await?;
        let candidates = self.free_old_images(candidates, free_time).await?;
        let fs = self.runtime.image_fs().await?;
        let capacity = u128::from(fs.capacity);
        let available = u128::from(fs.available.min(fs.capacity));
        if capacity == 0 {
            let err = ImageGcError::ZeroCapacity;
            self.recorder.event(
                EventType::Warning,
                EventObject::node(&self.node_name),
                INVALID_DISK_CAPACITY,
                err.to_string(),
            );
            return Err(err);
        }
        let usage_percent = 100 - available * 100 / capacity;
        if usage_percent < u128::from(self.policy.high_threshold_percent) {
            return Ok(());
        }
        let target_available = capacity * u128::from(100 - self.policy.low_threshold_percent) / 100;
        let wanted = u64::try_from(target_available.saturating_sub(available)).unwrap_or(u64::MAX);
        tracing::info!(
            usage = %usage_percent,
            high_threshold = self.policy.high_threshold_percent,
            amount_to_free = wanted,
            low_threshold = self.policy.low_threshold_percent,
            "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        let freed = self.free_space(wanted, free_time, &candidates).await?;
        if freed < wanted {
            self.recorder.event(
                EventType::Warning,
                EventObject::node(&self.node_name),
                FREE_DISK_SPACE_FAILED,
                format!(
                    "Failed to garbage collect required amount of images. Attempted to free \
                     {wanted} bytes, but only found {freed} bytes eligible to free."
                ),
            );
            return Err(ImageGcError::NotEnough { wanted, freed });
        }
        Ok(())
    }

    /// A fresh detection's unused, unpinned images, least recently used first, then first
    /// detected first (the id last, so the order never depends on the map's).
    async fn eviction_order(&mut self, free_time: Instant) -> Result<Vec<Candidate>, ImageGcError> {
        let in_use = self.detect(Some(free_time)).await?;
        let mut candidates: Vec<Candidate> = self
            .records
            .iter()
            .filter(|(id, record)| !in_use.contains(*id) && !record.pinned)
            .map(|(id, record)| Candidate {
                id: id.clone(),
                record: *record,
            })
            .collect();
        candidates.sort_by(|a, b| {
            (a.record.last_used, a.record.first_detected, &a.id).cmp(&(
                b.record.last_used,
                b.record.first_detected,
                &b.id,
            ))
        });
        Ok(candidates)
    }

    /// `freeOldImages`: once the agent has been collecting for longer than `imageMaximumGCAge`,
    /// removes every candidate unused for longer. Returns the candidates left.
    async fn free_old_images(
        &mut self,
        candidates: Vec<Candidate>,
        free_time: Instant,
    ) -> Result<Vec<Candidate>, ImageGcError> {
        let max_age = self.policy.maximum_age;
        if max_age.is_zero() || free_time.duration_since(self.began) <= max_age {
            return Ok(candidates);
        }
        let mut remaining = Vec::with_capacity(candidates.len());
        let mut errors = Vec::new();
        for candidate in candidates {
            let unused_for = candidate
                .record
                .last_used
                .map_or(Duration::MAX, |used| free_time.duration_since(used));
            if unused_for <= max_age {
                remaining.push(candidate);
                continue;
            }
            if let Err(err) = self.free_image(&candidate, Reason::Age).await {
                errors.push(err);
                remaining.push(candidate);
            }
        }
        aggregate(errors, 0, 0)?;
        Ok(remaining)
    }

    /// `freeSpace`: removes candidates in order, skipping those younger than the minimum age,
    /// until their sizes reach `wanted`. Returns the bytes freed.
    async fn free_space(
        &mut self,
        wanted: u64,
        free_time: Instant,
        candidates: &[Candidate],
    ) -> Result<u64, ImageGcError> {
        let mut freed = 0_u64;
        let mut errors = Vec::new();
        for candidate in candidates {
            if let Some(detected) = candidate.record.first_detected {
                let age = free_time.duration_since(detected);
                if age < self.policy.minimum_age {
                    tracing::debug!(image = %candidate.id, ?age, minimum_age = ?self.policy.minimum_age,
                        "image is younger than imageMinimumGCAge, not eligible for garbage collection");
                    continue;
                }
            }
            if let Err(err) = self.free_image(candidate, Reason::Space).await {
                errors.push(err);
                continue;
            }
            freed = freed.saturating_add(candidate.record.size);
            if freed >= wanted {
                break;
            }
        }
        aggregate(errors, wanted, freed)?;
        Ok(freed)
    }

    async fn free_image(
        &mut self,
        candidate: &Candidate,
        reason: Reason,
    ) -> Result<(), ImageGcError> {
        tracing::info!(image = %candidate.id, size = candidate.record.size, reason = reason.as_str(),
            "removing image to free bytes");
        self.runtime.remove_image(&candidate.id).await?;
        self.records.remove(&candidate.id);
        Ok(())
    }
}

/// One error for all the removals that failed, or `Ok` when none did.
fn aggregate(mut errors: Vec<ImageGcError>, wanted: u64, freed: u64) -> Result<(), ImageGcError> {
    if errors.is_empty() {
        return Ok(());
    }
    let failed = errors.len();
    let first = errors.swap_remove(0);
    Err(ImageGcError::Removals {
        wanted,
        freed,
        failed,
        first: Box::new(first),
    })
}

/// Eviction's way to the image garbage collector (the kubelet hands its `ImageGC` and the stats
/// provider's `HasDedicatedImageFs` to the eviction manager).
#[derive(Clone)]
pub struct ImageGcHandle {
    requests: mpsc::Sender<DeleteRequest>,
    runtime: Arc<dyn ImageGcRuntime>,
    root_dir: PathBuf,
}

impl ImageGcHandle {
    /// Asks the manager to delete every unused image now and waits for it. Returns the bytes
    /// freed.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(reply)
            .await
            .map_err(|_| ImageGcError::Stopped)?;
        answer.await.map_err(|_| ImageGcError::Stopped)?
    }

    /// Whether the image filesystem is another device than the root directory's, as the kubelet
    /// compares the image filesystem's device with the root filesystem's.
    pub async fn has_dedicated_image_fs(&self) -> Result<bool, ImageGcError> {
        let image_fs = self.runtime.image_fs_device().await?;
        let root_dir = self.root_dir.clone();
        let root_fs = device_of(root_dir).await?;
        Ok(image_fs != root_fs)
    }
}

/// The device (`st_dev`) of the filesystem holding `path`.
async fn device_of(path: PathBuf) -> Result<u64, ImageGcError> {
    let stat_error = |path: &PathBuf, source: std::io::Error| ImageGcError::Stat {
        path: path.display().to_string(),
        source,
    };
    let probe = path.clone();
    let stat = tokio::task::spawn_blocking(move || rustix::fs::stat(&probe))
        .await
        .map_err(|join| stat_error(&path, std::io::Error::other(join)))?
        .map_err(|errno| stat_error(&path, errno.into()))?;
    Ok(stat.st_dev)
}

#[async_trait]
impl ImageReclaimer for ImageGcHandle {
    async fn delete_unused_images(&self) -> Result<(), String> {
        let freed = ImageGcHandle::delete_unused_images(self)
            .await
            .map_err(|err| error_chain(&err))?;
        tracing::info!(freed, "eviction manager: deleted unused images");
        Ok(())
    }

    async fn has_dedicated_image_fs(&self) -> Result<bool, String> {
        ImageGcHandle::has_dedicated_image_fs(self)
            .await
            .map_err(|err| error_chain(&err))
    }
}
