//! Image references in the normalised form containerd's CRI plugin stores and reports (docker's
//! `ParseDockerRef`: `busybox` → `docker.io/library/busybox:latest`), and image ids. The kubelet
//! side is `pkg/kubelet/images`, which hands the runtime whatever the pod spec says.

use std::fmt::{self, Write as _};

use sha2::{Digest as _, Sha256};

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DOMAIN: &str = "index.docker.io";
const OFFICIAL_PREFIX: &str = "library/";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageRefError {
    #[error("invalid image reference {reference:?}: {reason}")]
    Invalid {
        reference: String,
        reason: &'static str,
    },
}

/// A normalised reference: a repository with a tag or a digest (a digest wins over a tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `docker.io/library/busybox`.
    pub repository: String,
    pub tag_or_digest: TagOrDigest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagOrDigest {
    Tag(String),
    Digest(String),
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tag_or_digest {
            TagOrDigest::Tag(tag) => write!(f, "{}:{tag}", self.repository),
            TagOrDigest::Digest(digest) => write!(f, "{}@{digest}", self.repository),
        }
    }
}

impl Reference {
    pub fn parse(reference: &str) -> Result<Self, ImageRefError> {
        let invalid = |reason| ImageRefError::Invalid {
            reference: reference.to_owned(),
            reason,
        };
        let (named, digest) = match reference.split_once('@') {
            Some((named, digest)) => {
                if !is_digest(digest) {
                    return Err(invalid("the digest is not sha256:<64 hex digits>"));
                }
                (named, Some(digest))
            }
            None => (reference, None),
        };
        let last_slash = named.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match named[last_slash..].rfind(':') {
            Some(colon) => (
                &named[..last_slash + colon],
                Some(&named[last_slash + colon + 1..]),
            ),
            None => (named, None),
        };
        if name.is_empty() || tag.is_some_and(str::is_empty) {
            return Err(invalid("empty name or tag"));
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first, rest.to_owned())
            }
            _ => (DEFAULT_DOMAIN, name.to_owned()),
        };
        let domain = if domain == LEGACY_DOMAIN {
            DEFAULT_DOMAIN
        } else {
            domain
        };
        if path.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(invalid("repository name must be lowercase"));
        }
        let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
            format!("{OFFICIAL_PREFIX}{path}")
        } else {
            path
        };
        let tag_or_digest = match (digest, tag) {
            (Some(digest), _) => TagOrDigest::Digest(digest.to_owned()),
            (None, Some(tag)) => TagOrDigest::Tag(tag.to_owned()),
            (None, None) => TagOrDigest::Tag("latest".to_owned()),
        };
        Ok(Self {
            repository: format!("{domain}/{path}"),
            tag_or_digest,
        })
    }
}

/// `sha256:` and 64 lowercase hex digits: an image id or a manifest digest.
pub fn is_digest(value: &str) -> bool {
    value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A made-up but stable `sha256:` digest of `text`: the same reference always gets the same id.
pub fn digest_of(text: &str) -> String {
    let hash = Sha256::digest(text.as_bytes());
    hash.iter().fold(String::from("sha256:"), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn normalized(reference: &str) -> String {
        Reference::parse(reference).unwrap().to_string()
    }

    #[test]
    fn references_normalise_as_docker_does() {
        assert_eq!(normalized("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalized("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(normalized("user/app"), "docker.io/user/app:latest");
        assert_eq!(
            normalized("index.docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            normalized("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(
            normalized("localhost:5000/a/b"),
            "localhost:5000/a/b:latest"
        );
        assert_eq!(normalized("localhost/app:v1"), "localhost/app:v1");
        assert_eq!(
            normalized(&format!("busybox:1.36@{DIGEST}")),
            format!("docker.io/library/busybox@{DIGEST}")
        );
        assert_eq!(
            Reference::parse(&format!("busybox@{DIGEST}"))
                .unwrap()
                .repository,
            "docker.io/library/busybox"
        );
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in ["", "Busybox", "busybox:", "busybox@sha256:12", ":tag"] {
            assert!(Reference::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn digests_are_recognised_and_stable() {
        assert!(is_digest(DIGEST));
        assert!(!is_digest("sha256:0123"));
        assert!(!is_digest(&DIGEST.to_uppercase()));
        let made = digest_of("docker.io/library/busybox:latest");
        assert!(is_digest(&made));
        assert_eq!(made, digest_of("docker.io/library/busybox:latest"));
        assert_ne!(made, digest_of("docker.io/library/busybox:1.36"));
    }
}
