//! Image references and pull policies (the kubelet's `pkg/kubelet/images`): normalising a pod's image
//! name the way the Docker/containerd reference parser does, and the effective `imagePullPolicy`.

/// Why an image reference is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("invalid image reference {image:?}: {why}")]
    InvalidReference { image: String, why: &'static str },
    #[error("invalid imagePullPolicy {policy:?}: must be Always, IfNotPresent or Never")]
    InvalidPullPolicy { policy: String },
}

const DEFAULT_REGISTRY: &str = "docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";

/// `imagePullPolicy` of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// The fully qualified form of an image reference: `busybox` → `docker.io/library/busybox:latest`,
/// `me/app:1` → `docker.io/me/app:1`; references with a registry host and digests stay as they are
/// (a missing tag still becomes `:latest` unless a digest pins the image).
pub fn normalize_image(image: &str) -> Result<String, ImageError> {
    let invalid = |why| ImageError::InvalidReference {
        image: image.to_owned(),
        why,
    };
    if image.is_empty() {
        return Err(invalid("empty"));
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_uppercase()) {
        return Err(invalid(
            "contains whitespace or upper-case letters in the repository",
        ));
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) if !digest.is_empty() => (name, Some(digest)),
        Some(_) => return Err(invalid("empty digest")),
        None => (image, None),
    };
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if repo.split('/').any(str::is_empty) || tag == Some("") {
        return Err(invalid("empty repository or tag"));
    }
    let repo = match repo.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => repo.to_owned(),
        Some(_) => format!("{DEFAULT_REGISTRY}/{repo}"),
        None => format!("{DEFAULT_REGISTRY}/{OFFICIAL_REPO_PREFIX}{repo}"),
    };
    let mut normalized = repo;
    match (tag, digest) {
        (Some(tag), _) => {
            normalized.push(':');
            normalized.push_str(tag);
        }
        (None, None) => {
            normalized.push(':');
            normalized.push_str(DEFAULT_TAG);
        }
        (None, Some(_)) => {}
    }
    if let Some(digest) = digest {
        normalized.push('@');
        normalized.push_str(digest);
    }
    Ok(normalized)
}

/// The repository of a normalised reference, without tag or digest
/// (`docker.io/library/busybox:latest` → `docker.io/library/busybox`): what credentials are
/// looked up for.
pub fn repository(normalized: &str) -> &str {
    let name = normalized
        .split_once('@')
        .map_or(normalized, |(name, _)| name);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[last_slash..].rfind(':') {
        Some(colon) => &name[..last_slash + colon],
        None => name,
    }
}

/// The container's pull policy; unset defaults by tag as the API server does: `:latest` or no tag
/// (and no digest) → `Always`, anything else → `IfNotPresent`.
pub fn pull_policy(policy: Option<&str>, image: &str) -> Result<PullPolicy, ImageError> {
    match policy {
        Some("Always") => Ok(PullPolicy::Always),
        Some("IfNotPresent") => Ok(PullPolicy::IfNotPresent),
        Some("Never") => Ok(PullPolicy::Never),
        Some("") | None => {
            let name = image.split('@').next().unwrap_or(image);
            let last = name.rsplit('/').next().unwrap_or(name);
            let tag = last.rsplit_once(':').map(|(_, tag)| tag);
            let pinned = image.contains('@');
            Ok(match tag {
                Some("latest") => PullPolicy::Always,
                None if !pinned => PullPolicy::Always,
                _ => PullPolicy::IfNotPresent,
            })
        }
        Some(other) => Err(ImageError::InvalidPullPolicy {
            policy: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_become_docker_hub_references() {
        assert_eq!(
            normalize_image("busybox").unwrap(),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            normalize_image("busybox:1.35").unwrap(),
            "docker.io/library/busybox:1.35"
        );
        assert_eq!(
            normalize_image("me/app").unwrap(),
            "docker.io/me/app:latest"
        );
        assert_eq!(
            normalize_image("registry.k8s.io/pause:3.10").unwrap(),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(
            normalize_image("localhost:5000/app").unwrap(),
            "localhost:5000/app:latest"
        );
        assert_eq!(
            normalize_image("busybox@sha256:abc").unwrap(),
            "docker.io/library/busybox@sha256:abc"
        );
    }

    #[test]
    fn the_repository_drops_tag_and_digest_but_keeps_the_registry_port() {
        assert_eq!(
            repository("docker.io/library/busybox:latest"),
            "docker.io/library/busybox"
        );
        assert_eq!(
            repository("127.0.0.1:5443/lab/busybox:private"),
            "127.0.0.1:5443/lab/busybox"
        );
        assert_eq!(repository("localhost:5000/app"), "localhost:5000/app");
        assert_eq!(repository("quay.io/app:1@sha256:abc"), "quay.io/app");
    }

    #[test]
    fn bad_references_are_rejected_with_the_reason() {
        for bad in ["", "Busybox", "busybox:", "a b", "busybox@", "/x"] {
            assert!(
                matches!(
                    normalize_image(bad),
                    Err(ImageError::InvalidReference { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn pull_policy_defaults_by_tag() {
        assert_eq!(pull_policy(None, "busybox").unwrap(), PullPolicy::Always);
        assert_eq!(
            pull_policy(None, "busybox:latest").unwrap(),
            PullPolicy::Always
        );
        assert_eq!(
            pull_policy(None, "busybox:1.35").unwrap(),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            pull_policy(None, "localhost:5000/app").unwrap(),
            PullPolicy::Always
        );
        assert_eq!(
            pull_policy(None, "busybox@sha256:abc").unwrap(),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            pull_policy(Some("Never"), "busybox").unwrap(),
            PullPolicy::Never
        );
        assert!(pull_policy(Some("Sometimes"), "busybox").is_err());
    }
}
