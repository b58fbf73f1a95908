//! The CRI `ImageService`: images are names only. A pull downloads nothing and records the image
//! as present under a made-up, stable id (the sha256 of its normalised reference), with the
//! reference as its tag (or digest) and a made-up repo digest, so status fields read as
//! containerd's would.
//! containerd's `image_*.go` in `pkg/cri/server`; the kubelet side is `pkg/kubelet/images`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use tonic::{Request, Response, Status};

use crate::cri::v1 as cri;
use crate::cri::v1::image_service_server::ImageService;
use crate::image_ref::{self, ImageRefError, Reference, TagOrDigest};
use crate::state::{Shared, unix_nanos};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("can not resolve {reference:?} locally")]
    Resolve {
        reference: String,
        #[source]
        source: ImageRefError,
    },
    #[error("failed to pull image {reference:?}")]
    Pull {
        reference: String,
        #[source]
        source: ImageRefError,
    },
}

impl From<ImageError> for Status {
    fn from(e: ImageError) -> Self {
        let source = match &e {
            ImageError::Resolve { source, .. } | ImageError::Pull { source, .. } => source,
        };
        Status::unknown(format!("{e}: {source}"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
}

impl Image {
    fn to_cri(&self) -> cri::Image {
        cri::Image {
            id: self.id.clone(),
            repo_tags: self.repo_tags.clone(),
            repo_digests: self.repo_digests.clone(),
            ..Default::default()
        }
    }
}

/// The images present, by id.
#[derive(Debug, Default)]
pub struct Images {
    by_id: BTreeMap<String, Image>,
}

impl Images {
    pub fn get(&self, id: &str) -> Option<&Image> {
        self.by_id.get(id)
    }

    /// The image a reference or id names, if present (containerd's `localResolve`).
    pub fn resolve(&self, reference: &str) -> Result<Option<&Image>, ImageRefError> {
        if image_ref::is_digest(reference) {
            return Ok(self.by_id.get(reference));
        }
        let normalized = Reference::parse(reference)?.to_string();
        Ok(self.by_id.values().find(|image| {
            image.repo_tags.contains(&normalized) || image.repo_digests.contains(&normalized)
        }))
    }

    /// Records the image as present; returns its id.
    pub fn pull(&mut self, reference: &str) -> Result<String, ImageRefError> {
        if let Some(image) = self.resolve(reference)? {
            return Ok(image.id.clone());
        }
        let parsed = Reference::parse(reference)?;
        let normalized = parsed.to_string();
        let id = image_ref::digest_of(&normalized);
        let (repo_tags, repo_digests) = match parsed.tag_or_digest {
            TagOrDigest::Tag(_) => (
                vec![normalized],
                vec![format!(
                    "{}@{}",
                    parsed.repository,
                    image_ref::digest_of(&format!("manifest {id}"))
                )],
            ),
            TagOrDigest::Digest(_) => (Vec::new(), vec![normalized]),
        };
        self.by_id.insert(
            id.clone(),
            Image {
                id: id.clone(),
                repo_tags,
                repo_digests,
            },
        );
        Ok(id)
    }

    /// Removes the image a reference or id names; an absent image is not an error.
    pub fn remove(&mut self, reference: &str) -> Result<(), ImageRefError> {
        if let Some(id) = self.resolve(reference)?.map(|image| image.id.clone()) {
            self.by_id.remove(&id);
        }
        Ok(())
    }
}

pub struct HollowImages {
    pub state: Shared,
    /// Reported as the image and container filesystem.
    pub root: PathBuf,
}

fn image_of(spec: Option<&cri::ImageSpec>) -> &str {
    spec.map_or("", |s| s.image.as_str())
}

#[tonic::async_trait]
impl ImageService for HollowImages {
    async fn list_images(
        &self,
        _request: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        let images = self
            .state
            .lock()
            .images
            .by_id
            .values()
            .map(Image::to_cri)
            .collect();
        Ok(Response::new(cri::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        let reference = image_of(request.get_ref().image.as_ref());
        let state = self.state.lock();
        let image = state
            .images
            .resolve(reference)
            .map_err(|source| ImageError::Resolve {
                reference: reference.to_owned(),
                source,
            })?;
        Ok(Response::new(cri::ImageStatusResponse {
            image: image.map(Image::to_cri),
            info: HashMap::default(),
        }))
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        let reference = image_of(request.get_ref().image.as_ref());
        let image_ref =
            self.state
                .lock()
                .images
                .pull(reference)
                .map_err(|source| ImageError::Pull {
                    reference: reference.to_owned(),
                    source,
                })?;
        Ok(Response::new(cri::PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        let reference = image_of(request.get_ref().image.as_ref());
        self.state
            .lock()
            .images
            .remove(reference)
            .map_err(|source| ImageError::Resolve {
                reference: reference.to_owned(),
                source,
            })?;
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    /// The root directory's filesystem with nothing used: hollow images take no space.
    async fn image_fs_info(
        &self,
        _request: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        let usage = cri::FilesystemUsage {
            timestamp: unix_nanos(),
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: self.root.to_string_lossy().into_owned(),
            }),
            used_bytes: Some(cri::UInt64Value { value: 0 }),
            inodes_used: Some(cri::UInt64Value { value: 0 }),
        };
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![usage.clone()],
            container_filesystems: vec![usage],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulled_images_resolve_by_any_spelling_and_id() {
        let mut images = Images::default();
        let id = images.pull("busybox").unwrap();
        assert!(image_ref::is_digest(&id));
        assert_eq!(images.pull("docker.io/library/busybox:latest").unwrap(), id);
        for spelling in ["busybox", "busybox:latest", "library/busybox", id.as_str()] {
            assert_eq!(
                images.resolve(spelling).unwrap().map(|i| i.id.as_str()),
                Some(id.as_str()),
                "{spelling}"
            );
        }
        let image = images.get(&id).unwrap();
        assert_eq!(image.repo_tags, ["docker.io/library/busybox:latest"]);
        let digest = image.repo_digests[0].clone();
        assert!(
            digest.starts_with("docker.io/library/busybox@sha256:"),
            "{digest}"
        );
        assert_ne!(digest.split_once('@').unwrap().1, id);
        assert_eq!(images.resolve("busybox:1.36").unwrap(), None);

        assert_eq!(images.pull(&digest).unwrap(), id, "its own repo digest");
        let other = format!("busybox@{}", image_ref::digest_of("other"));
        let by_digest = images.pull(&other).unwrap();
        assert_ne!(by_digest, id);
        assert_eq!(
            images.get(&by_digest).unwrap().repo_tags,
            Vec::<String>::new()
        );

        images.remove("busybox").unwrap();
        assert_eq!(images.resolve(&id).unwrap(), None);
        images.remove("busybox").unwrap();
        assert!(images.pull("Busybox").is_err());
    }
}
