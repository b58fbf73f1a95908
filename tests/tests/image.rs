//! End-to-end: the agent's container image (`cargo xtask image --import`) in the lab's containerd:
//! it runs `ringlet --version` as a container and prints the workspace's version, and its one layer
//! holds the binary and the CA bundle and nothing else. Run as root after `cargo xtask lab up`.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use ringlet_tests::{RINGLET_IMAGE, image_dir, k8s_ctr, require_ringlet_image};
use serde_json::Value;

/// A container the test runs; removed when dropped, also when the test fails midway.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = k8s_ctr(&["tasks", "kill", "--signal", "SIGKILL", &self.0]);
        let _ = k8s_ctr(&["tasks", "delete", &self.0]);
        let _ = k8s_ctr(&["containers", "delete", &self.0]);
    }
}

/// A blob of the image layout by digest.
fn blob(layout: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("digest {digest} is not sha256"))?;
    let path = layout.join("blobs").join("sha256").join(hex);
    fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

#[test]
fn the_image_runs_ringlet_version_as_a_container() -> Result<()> {
    if !require_ringlet_image("the_image_runs_ringlet_version_as_a_container") {
        return Ok(());
    }
    let container = Container(format!("ringlet-image-test-{}", std::process::id()));
    let out = k8s_ctr(&[
        "run",
        "--rm",
        RINGLET_IMAGE,
        &container.0,
        "/usr/local/bin/ringlet",
        "--version",
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctr run failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!("ringlet {}", env!("CARGO_PKG_VERSION"))
    );
    Ok(())
}

#[test]
fn the_image_holds_the_binary_and_the_ca_bundle_only() -> Result<()> {
    if !require_ringlet_image("the_image_holds_the_binary_and_the_ca_bundle_only") {
        return Ok(());
    }
    let layout = image_dir().join("oci");
    let index_path = layout.join("index.json");
    let index: Value = serde_json::from_slice(
        &fs::read(&index_path).with_context(|| format!("reading {}", index_path.display()))?,
    )?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?;
    // The layout is what the lab imported: containerd lists the same manifest under the name.
    let listed = k8s_ctr(&["images", "ls"])?;
    let imported = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .find_map(|line| {
            // REF TYPE DIGEST SIZE PLATFORMS LABELS
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields[..] {
                [name, _, digest, ..] if name == RINGLET_IMAGE => Some(digest.to_owned()),
                _ => None,
            }
        });
    assert_eq!(imported.as_deref(), Some(digest), "imported manifest");

    let manifest: Value = serde_json::from_slice(&blob(&layout, digest)?)?;
    let config: Value = serde_json::from_slice(&blob(
        &layout,
        manifest["config"]["digest"].as_str().unwrap_or_default(),
    )?)?;
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/ringlet"])
    );
    let layers = manifest["layers"]
        .as_array()
        .context("the manifest has no layers")?;
    let [layer] = &layers[..] else {
        bail!("one layer expected, the manifest has {}", layers.len());
    };
    let compressed = blob(&layout, layer["digest"].as_str().unwrap_or_default())?;
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(compressed.as_slice()).read_to_end(&mut tar)?;
    let mut files = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    for entry in tar::Archive::new(tar.as_slice()).entries()? {
        let entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        match entry.header().entry_type() {
            tar::EntryType::Regular => files.insert(path),
            tar::EntryType::Directory => dirs.insert(path),
            other => bail!("{path} is a {other:?}, not a file or directory"),
        };
    }
    assert_eq!(
        files,
        BTreeSet::from([
            "etc/ssl/certs/ca-certificates.crt".to_owned(),
            "usr/local/bin/ringlet".to_owned(),
        ])
    );
    // Directories only as the two files' parents.
    for dir in &dirs {
        assert!(
            files.iter().any(|file| file.starts_with(dir.as_str())),
            "{dir} holds neither file"
        );
    }
    Ok(())
}
