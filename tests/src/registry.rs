//! The lab's private image registry (`cargo xtask lab up --registry`): Debian's `docker-registry`
//! on loopback with TLS (a CA of the lab's own, which the lab's containerd trusts through its
//! `hosts.toml`) and htpasswd basic auth for one fixed lab user, holding a private copy of the
//! lab's busybox image. The names here are shared by the xtask that sets it up and the tests that
//! pull from it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{LAB_DIR, daemon::Daemon, missing_prerequisite, skip_unless};

/// Where the registry keeps its configuration, certificates, htpasswd file, storage, log and pid.
pub const REGISTRY_DIR: &str = "/var/lib/ringlet-lab/registry";
/// The registry's address: loopback only, TLS.
pub const REGISTRY_HOST: &str = "127.0.0.1:5443";
/// The one user the registry accepts, and its password (a lab, not a secret).
pub const REGISTRY_USER: &str = "ringlet-lab";
pub const REGISTRY_PASSWORD: &str = "ringlet-lab-password";
/// The private image the lab pushes: its busybox under the registry's name.
pub const PRIVATE_IMAGE: &str = "127.0.0.1:5443/lab/busybox:private";
/// The lab's local image that [`PRIVATE_IMAGE`] is a copy of.
pub const PRIVATE_IMAGE_SOURCE: &str = "docker.io/library/busybox:1.35";

/// The CA that signed the registry's serving certificate.
pub fn ca_path() -> PathBuf {
    Path::new(REGISTRY_DIR).join("ca.crt")
}

/// containerd's registry host directory (`config_path` of the lab's containerd, `--hosts-dir` of
/// `ctr`): `<host:port>/hosts.toml` says whom to trust for that registry.
pub fn hosts_dir() -> PathBuf {
    Path::new(LAB_DIR).join("certs.d")
}

/// The registry as `lab up --registry` started it.
pub fn registry_daemon() -> Daemon {
    Daemon::new("docker-registry", REGISTRY_DIR)
}

/// The HTTP status of `GET /v2/<path>` over TLS with the lab CA, with the lab user's credentials
/// when `authenticated`; `None` when the registry does not answer.
pub fn registry_status(path: &str, authenticated: bool) -> Option<u16> {
    let mut curl = Command::new("curl");
    curl.args(["--silent", "--output", "/dev/null", "--max-time", "5"])
        .args(["--write-out", "%{http_code}"])
        .arg("--cacert")
        .arg(ca_path())
        .args([
            "--header",
            "Accept: application/vnd.oci.image.manifest.v1+json",
        ]);
    if authenticated {
        curl.args(["--user", &format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}")]);
    }
    let out = curl
        .arg(format!("https://{REGISTRY_HOST}/v2/{path}"))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .ok()
        .filter(|code| *code != 0)
}

/// Whether the registry answers and asks for credentials (`401` without them).
pub fn registry_answers() -> bool {
    registry_status("", false) == Some(401)
}

/// The manifest path of [`PRIVATE_IMAGE`] below `/v2/`.
pub fn private_image_manifest_path() -> String {
    let (repository, tag) = PRIVATE_IMAGE
        .strip_prefix(&format!("{REGISTRY_HOST}/"))
        .and_then(|rest| rest.rsplit_once(':'))
        .unwrap_or_default();
    format!("{repository}/manifests/{tag}")
}

/// [`crate::require_lab`] plus the registry: answering, and holding the private image for the
/// lab user. Prints SKIP (panics under `CI=true`) when not.
pub fn require_registry(test: &str) -> bool {
    let missing = missing_prerequisite().or_else(|| {
        let set_up = "run `cargo xtask lab up --registry`";
        if !registry_answers() {
            return Some(format!(
                "the lab registry does not answer on {REGISTRY_HOST}: {set_up}"
            ));
        }
        match registry_status(&private_image_manifest_path(), true) {
            Some(200) => None,
            other => Some(format!(
                "the lab registry does not hold {PRIVATE_IMAGE} (status {other:?}): {set_up}"
            )),
        }
    });
    skip_unless(test, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_image_is_on_the_registry_host() {
        assert!(PRIVATE_IMAGE.starts_with(&format!("{REGISTRY_HOST}/")));
        assert_eq!(
            private_image_manifest_path(),
            "lab/busybox/manifests/private"
        );
    }
}
