//! Image garbage collection's view of a CRI runtime (what the kubelet's image GC reads through
//! `container.Runtime` and the CRI stats provider's `ImageFsStats`): images, the images every
//! container and the sandboxes use, removal, and the image filesystem's capacity from `statvfs`
//! of the mountpoint `ImageFsInfo` reports (cadvisor's `GetDirFsInfo`), and that filesystem's
//! device.

use std::collections::HashSet;
use std::path::PathBuf;

use async_trait::async_trait;

use super::{FsCapacity, ImageGcError, ImageGcRuntime, ImageInfo};
use crate::kuberuntime::CriClient;

/// The key of containerd's verbose `Status` information holding its configuration.
const CONFIG_INFO_KEY: &str = "config";

/// [`ImageGcRuntime`] over a CRI connection.
pub struct CriImageGcRuntime {
    cri: CriClient,
}

impl CriImageGcRuntime {
    pub fn new(cri: CriClient) -> Self {
        Self { cri }
    }

    /// The id of the runtime's sandbox image, when the runtime names one (containerd's
    /// `sandboxImage`) and has it.
    async fn sandbox_image_id(&self) -> Result<Option<String>, ImageGcError> {
        let info = self
            .cri
            .status_info()
            .await
            .map_err(ImageGcError::SandboxImage)?;
        let Some(image) = info
            .get(CONFIG_INFO_KEY)
            .and_then(|config| sandbox_image(config))
        else {
            return Ok(None);
        };
        let status = self
            .cri
            .image_status(&image)
            .await
            .map_err(ImageGcError::SandboxImage)?;
        Ok(status.map(|image| image.id))
    }

    /// Where the image filesystem is mounted, per CRI `ImageFsInfo`.
    async fn image_fs_mountpoint(&self) -> Result<String, ImageGcError> {
        let info = self
            .cri
            .image_fs_info()
            .await
            .map_err(ImageGcError::FsInfo)?;
        // Like the kubelet, only the first image filesystem counts.
        info.image_filesystems
            .into_iter()
            .next()
            .and_then(|fs| fs.fs_id)
            .map(|id| id.mountpoint)
            .filter(|mountpoint| !mountpoint.is_empty())
            .ok_or(ImageGcError::NoImageFs)
    }
}

/// `sandboxImage` of containerd's configuration JSON.
fn sandbox_image(config: &str) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(config).ok()?;
    let image = config.get("sandboxImage")?.as_str()?;
    (!image.is_empty()).then(|| image.to_owned())
}

#[async_trait]
impl ImageGcRuntime for CriImageGcRuntime {
    async fn list_images(&self) -> Result<Vec<ImageInfo>, ImageGcError> {
        let images = self
            .cri
            .list_images(None)
            .await
            .map_err(ImageGcError::ListImages)?;
        Ok(images
            .into_iter()
            .map(|image| ImageInfo {
                id: image.id,
                size: image.size,
                pinned: image.pinned,
            })
            .collect())
    }

    async fn images_in_use(&self) -> Result<HashSet<String>, ImageGcError> {
        let containers = self
            .cri
            .list_containers(None)
            .await
            .map_err(ImageGcError::ListContainers)?;
        // Runtimes fill these differently (containerd: `image_ref` is the image id, newer ones
        // also set `image_id`); any of them naming an image keeps it.
        let mut in_use: HashSet<String> = containers
            .into_iter()
            .flat_map(|container| {
                [
                    container.image_id,
                    container.image_ref,
                    container.image.map(|spec| spec.image).unwrap_or_default(),
                ]
            })
            .filter(|id| !id.is_empty())
            .collect();
        in_use.extend(self.sandbox_image_id().await?);
        Ok(in_use)
    }

    async fn remove_image(&self, id: &str) -> Result<(), ImageGcError> {
        self.cri
            .remove_image(id)
            .await
            .map_err(|source| ImageGcError::Remove {
                id: id.to_owned(),
                source,
            })
    }

    async fn image_fs(&self) -> Result<FsCapacity, ImageGcError> {
        let mountpoint = self.image_fs_mountpoint().await?;
        let path = PathBuf::from(&mountpoint);
        let stat = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&path))
            .await
            .map_err(|join| ImageGcError::Statvfs {
                mountpoint: mountpoint.clone(),
                source: std::io::Error::other(join),
            })?
            .map_err(|errno| ImageGcError::Statvfs {
                mountpoint: mountpoint.clone(),
                source: errno.into(),
            })?;
        Ok(FsCapacity {
            capacity: stat.f_blocks.saturating_mul(stat.f_frsize),
            available: stat.f_bavail.saturating_mul(stat.f_frsize),
        })
    }

    async fn image_fs_device(&self) -> Result<u64, ImageGcError> {
        let mountpoint = self.image_fs_mountpoint().await?;
        super::device_of(PathBuf::from(mountpoint)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_image_comes_from_containerds_configuration() {
        assert_eq!(
            sandbox_image(
                r#"{"sandboxImage":"registry.k8s.io/pause:3.10","snapshotter":"overlayfs"}"#
            ),
            Some("registry.k8s.io/pause:3.10".to_owned())
        );
        assert_eq!(sandbox_image(r#"{"sandboxImage":""}"#), None);
        assert_eq!(sandbox_image(r#"{"snapshotter":"overlayfs"}"#), None);
        assert_eq!(sandbox_image("not json"), None);
    }
}
