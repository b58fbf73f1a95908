//! OCI image layouts built in memory, so the lab (and `cargo xtask image`) has images without any
//! registry or docker: one gzip layer, its config and manifest, and an `index.json` naming every tag
//! through the `io.containerd.image.name` annotation that `ctr images import` reads; written as a
//! tar for `ctr images import` or as a layout directory.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use flate2::{Compression, write::GzEncoder};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A layer's files, as an uncompressed tar with fixed owners and times so the same input always gives
/// the same digests (and a second `lab up` sees the image as already imported).
pub struct Layer {
    tar: tar::Builder<Vec<u8>>,
}

impl Layer {
    pub fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.dir_owned(path, mode, 0, 0)
    }

    /// A directory owned by `uid`:`gid` (a user's home), where [`Layer::dir`] gives root's.
    pub fn dir_owned(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> Result<()> {
        let mut header = Self::header(tar::EntryType::Directory, mode, 0);
        header.set_uid(uid);
        header.set_gid(gid);
        self.tar
            .append_data(&mut header, path, std::io::empty())
            .with_context(|| format!("adding directory {path} to a layer"))
    }

    /// A regular file; `mode` may carry the setuid bit (`0o4755`), which the runtime keeps.
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let mut header = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        self.tar
            .append_data(&mut header, path, data)
            .with_context(|| format!("adding file {path} to a layer"))
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut header = Self::header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut header, path, target)
            .with_context(|| format!("adding symlink {path} -> {target} to a layer"))
    }

    fn finish(self) -> Result<Vec<u8>> {
        self.tar.into_inner().context("finishing a layer tar")
    }

    /// Finishes and compresses the layer, so several images can share it without compressing
    /// it again (see [`build_shared`]).
    pub fn compress(self) -> Result<CompressedLayer> {
        let tar = self.finish()?;
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&tar).context("compressing a layer")?;
        Ok(CompressedLayer {
            diff_id: sha256(&tar),
            gz: gz.finish().context("compressing a layer")?,
        })
    }
}

/// A finished layer: the digest of its tar (the config's diff id) and its gzip blob.
pub struct CompressedLayer {
    diff_id: String,
    gz: Vec<u8>,
}

/// What the image runs and which names it is imported under.
pub struct ImageSpec<'a> {
    pub refs: &'a [&'a str],
    pub entrypoint: Option<&'a [&'a str]>,
    pub cmd: Option<&'a [&'a str]>,
    pub env: &'a [&'a str],
    /// The config's history entry: what made the image.
    pub created_by: &'a str,
}

/// An image layout: its tar ready for `ctr images import`, the digest of its manifest, and its
/// files (path in the layout, content) for [`Archive::write_layout`].
pub struct Archive {
    pub tar: Vec<u8>,
    pub manifest_digest: String,
    files: Vec<(String, Vec<u8>)>,
}

impl Archive {
    /// Writes the layout as a directory (`oci-layout`, `index.json`, `blobs/sha256/…`) at `dir`,
    /// replacing what was there.
    pub fn write_layout(&self, dir: &Path) -> Result<()> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        for (path, data) in &self.files {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            fs::write(&path, data).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({ "mediaType": media_type, "digest": sha256(blob), "size": blob.len() })
}

/// Builds the image layout for `layer` described by `spec`.
pub fn build(layer: Layer, spec: &ImageSpec<'_>) -> Result<Archive> {
    build_shared(&layer.compress()?, spec, None)
}

/// Builds the image layout for an already compressed `layer` described by `spec`, running as
/// `user` (the config's `User`: a name or `uid[:gid]`) when given, else as the runtime's default
/// (root).
pub fn build_shared(
    layer: &CompressedLayer,
    spec: &ImageSpec<'_>,
    user: Option<&str>,
) -> Result<Archive> {
    let mut config = serde_json::Map::new();
    config.insert("Env".into(), json!(spec.env));
    if let Some(entrypoint) = spec.entrypoint {
        config.insert("Entrypoint".into(), json!(entrypoint));
    }
    if let Some(cmd) = spec.cmd {
        config.insert("Cmd".into(), json!(cmd));
    }
    if let Some(user) = user {
        config.insert("User".into(), json!(user));
    }
    let config_blob = serde_json::to_vec(&json!({
        "architecture": oci_architecture(),
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [layer.diff_id] },
        "history": [{ "created_by": spec.created_by }],
    }))?;
    let manifest_blob = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config_blob),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer.gz)],
    }))?;
    let manifests: Vec<Value> = spec
        .refs
        .iter()
        .map(|name| {
            let mut d = descriptor(MANIFEST_MEDIA_TYPE, &manifest_blob);
            let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
            d["annotations"] = json!({
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            });
            d
        })
        .collect();
    let index_blob = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }))?;

    let manifest_digest = sha256(&manifest_blob);
    let mut files = vec![
        (
            "oci-layout".to_owned(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".to_owned(), index_blob),
    ];
    for blob in [layer.gz.clone(), config_blob, manifest_blob] {
        let digest = sha256(&blob);
        let hex = digest.trim_start_matches("sha256:");
        files.push((format!("blobs/sha256/{hex}"), blob));
    }
    let mut outer = Layer::new();
    outer.dir("blobs/", 0o755)?;
    outer.dir("blobs/sha256/", 0o755)?;
    for (path, data) in &files {
        outer.file(path, 0o644, data)?;
    }
    Ok(Archive {
        tar: outer.finish()?,
        manifest_digest,
        files,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;
    use std::io::Read;

    use super::*;

    fn entries(tar_bytes: &[u8]) -> HashMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(tar_bytes);
        let mut out = HashMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.insert(path, data);
        }
        out
    }

    fn blob<'a>(files: &'a HashMap<String, Vec<u8>>, digest: &str) -> &'a [u8] {
        let hex = digest.strip_prefix("sha256:").unwrap();
        &files[&format!("blobs/sha256/{hex}")]
    }

    #[test]
    fn layout_digests_sizes_and_names_are_consistent() {
        let mut layer = Layer::new();
        layer.dir("tmp/", 0o1777).unwrap();
        layer.file("bin/tool", 0o755, b"#!/bin/sh\n").unwrap();
        layer.symlink("bin/sh", "tool").unwrap();
        let spec = ImageSpec {
            refs: &["example.org/a:1", "example.org/a:latest"],
            entrypoint: None,
            cmd: Some(&["sh"]),
            env: &["PATH=/bin"],
            created_by: "test",
        };
        let archive = build(layer, &spec).unwrap();
        let files = entries(&archive.tar);

        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let manifests = index["manifests"].as_array().unwrap();
        let names: Vec<&str> = manifests
            .iter()
            .map(|m| {
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["example.org/a:1", "example.org/a:latest"]);
        assert_eq!(manifests[0]["digest"], archive.manifest_digest.as_str());

        let manifest_bytes = blob(&files, &archive.manifest_digest);
        assert_eq!(manifests[0]["size"], manifest_bytes.len());
        let manifest: Value = serde_json::from_slice(manifest_bytes).unwrap();
        let config_bytes = blob(&files, manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(manifest["config"]["size"], config_bytes.len());
        let layer_desc = &manifest["layers"][0];
        let layer_gz = blob(&files, layer_desc["digest"].as_str().unwrap());
        assert_eq!(layer_desc["size"], layer_gz.len());

        let mut layer_tar = Vec::new();
        flate2::read::GzDecoder::new(layer_gz)
            .read_to_end(&mut layer_tar)
            .unwrap();
        let config: Value = serde_json::from_slice(config_bytes).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256(&layer_tar).as_str());
        assert_eq!(config["config"]["Cmd"], json!(["sh"]));

        let mut layer_archive = tar::Archive::new(layer_tar.as_slice());
        let mut seen = Vec::new();
        for entry in layer_archive.entries().unwrap() {
            let entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            seen.push((path, entry.header().mode().unwrap()));
        }
        assert!(seen.contains(&("tmp/".to_owned(), 0o1777)));
        assert!(seen.contains(&("bin/tool".to_owned(), 0o755)));
    }

    fn config_of(archive: &Archive) -> Value {
        let files = entries(&archive.tar);
        let manifest: Value =
            serde_json::from_slice(blob(&files, &archive.manifest_digest)).unwrap();
        serde_json::from_slice(blob(&files, manifest["config"]["digest"].as_str().unwrap()))
            .unwrap()
    }

    #[test]
    fn images_sharing_a_layer_differ_only_in_their_config() {
        let mut layer = Layer::new();
        layer.dir_owned("home/user/", 0o755, 1000, 1000).unwrap();
        layer.file("bin/nnp", 0o4755, b"x").unwrap();
        let layer = layer.compress().unwrap();
        let spec = |refs| ImageSpec {
            refs,
            entrypoint: None,
            cmd: Some(&["sh"]),
            env: &[],
            created_by: "test",
        };
        let root = build_shared(&layer, &spec(&["a:1"]), None).unwrap();
        let user = build_shared(&layer, &spec(&["b:1"]), Some("1234")).unwrap();

        let (root_config, user_config) = (config_of(&root), config_of(&user));
        assert!(root_config["config"].get("User").is_none());
        assert_eq!(user_config["config"]["User"], "1234");
        assert_eq!(root_config["rootfs"], user_config["rootfs"]);
        assert_ne!(root.manifest_digest, user.manifest_digest);

        let files = entries(&user.tar);
        let manifest: Value = serde_json::from_slice(blob(&files, &user.manifest_digest)).unwrap();
        let layer_gz = blob(&files, manifest["layers"][0]["digest"].as_str().unwrap());
        let mut layer_tar = Vec::new();
        flate2::read::GzDecoder::new(layer_gz)
            .read_to_end(&mut layer_tar)
            .unwrap();
        let mut archive = tar::Archive::new(layer_tar.as_slice());
        let headers: Vec<(String, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            headers,
            [
                ("home/user/".to_owned(), 0o755, 1000),
                ("bin/nnp".to_owned(), 0o4755, 0)
            ]
        );
    }

    #[test]
    fn same_input_gives_same_manifest_digest() {
        let make = || {
            let mut layer = Layer::new();
            layer.file("x", 0o644, b"x").unwrap();
            let spec = ImageSpec {
                refs: &["a:1"],
                entrypoint: Some(&["/x"]),
                cmd: None,
                env: &[],
                created_by: "test",
            };
            build(layer, &spec).unwrap().manifest_digest
        };
        assert_eq!(make(), make());
    }
}
