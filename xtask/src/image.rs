//! `cargo xtask image`: the agent's container image, built without docker or a registry. It holds
//! the statically linked `ringlet` (glibc, `+crt-static`, a release build for the host's
//! `<arch>-unknown-linux-gnu` target in its own target subdirectory) at `/usr/local/bin/ringlet`,
//! the entrypoint, and the host's CA bundle at `/etc/ssl/certs/ca-certificates.crt`; nothing else.
//! Written under `target/image/` as an OCI layout directory (`oci/`) and as the tar `ctr images
//! import` takes (`ringlet-image.tar`), named [`ringlet_tests::RINGLET_IMAGE`] and `…:latest`.
//! `--import` also imports it into the lab's containerd, as `cargo xtask lab up` does once it is
//! built.

use std::fs;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ringlet_tests::{RINGLET_IMAGE, image_binary, image_dir, image_target};
use serde_json::Value;

use crate::oci::{self, ImageSpec, Layer};
use crate::{cargo, cmd, lab, workspace_root};

/// The image's names: the workspace version and `latest`.
const REFS: [&str; 2] = [RINGLET_IMAGE, "ghcr.io/ringlet/ringlet:latest"];
/// The CA bundle of Debian's `ca-certificates`, copied into the image at the same path.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The tar for `ctr images import`, in [`image_dir`].
const TARBALL: &str = "ringlet-image.tar";
/// ELF program header type of the program interpreter (the dynamic loader).
const PT_INTERP: u32 = 3;

pub fn run(import: bool) -> Result<()> {
    let started = Instant::now();
    let binary = build_static_binary()?;
    let built = started.elapsed();
    let ca_bundle = fs::read(CA_BUNDLE)
        .with_context(|| format!("reading {CA_BUNDLE} (Debian package ca-certificates)"))?;
    let mut layer = Layer::new();
    for dir in [
        "etc/",
        "etc/ssl/",
        "etc/ssl/certs/",
        "usr/",
        "usr/local/",
        "usr/local/bin/",
    ] {
        layer.dir(dir, 0o755)?;
    }
    layer.file("usr/local/bin/ringlet", 0o755, &binary)?;
    layer.file(CA_BUNDLE.trim_start_matches('/'), 0o644, &ca_bundle)?;
    let archive = oci::build(
        layer,
        &ImageSpec {
            refs: &REFS,
            entrypoint: Some(&["/usr/local/bin/ringlet"]),
            cmd: None,
            env: &[
                "PATH=/usr/local/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            ],
            created_by: "cargo xtask image",
        },
    )?;
    let dir = image_dir();
    archive.write_layout(&dir.join("oci"))?;
    let tarball = dir.join(TARBALL);
    fs::write(&tarball, &archive.tar).with_context(|| format!("writing {}", tarball.display()))?;
    println!(
        "image {} ({}): layout {}, tar {} ({} MiB); static build {:.0?}",
        REFS.join(", "),
        archive.manifest_digest,
        dir.join("oci").display(),
        tarball.display(),
        archive.tar.len() >> 20,
        built
    );
    if import {
        cmd::ensure_root("importing the image into the lab")?;
        lab::import_archive(&REFS, &archive.manifest_digest, &tarball)?;
    }
    Ok(())
}

/// Imports the image `cargo xtask image` built, if it did; nothing otherwise.
pub fn import_if_built() -> Result<()> {
    let tarball = image_dir().join(TARBALL);
    if !tarball.is_file() {
        return Ok(());
    }
    let index_path = image_dir().join("oci").join("index.json");
    let index: Value = serde_json::from_slice(
        &fs::read(&index_path).with_context(|| format!("reading {}", index_path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", index_path.display()))?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .with_context(|| format!("{} names no manifest", index_path.display()))?;
    lab::import_archive(&REFS, digest, &tarball)
}

/// Builds `ringlet` statically linked and returns it.
fn build_static_binary() -> Result<Vec<u8>> {
    let target = image_target();
    // With --target, RUSTFLAGS apply to the target's crates only (not build scripts), and the
    // output goes to target/<triple>/, leaving the normal builds alone.
    cmd::run(
        cargo()
            .current_dir(workspace_root())
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .args(["build", "--release", "--target", &target])
            .args(["-p", "ringlet", "--bin", "ringlet"]),
    )?;
    let path = image_binary();
    let binary = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    if has_interpreter(&binary)
        .with_context(|| format!("{} is not a 64-bit ELF executable", path.display()))?
    {
        bail!(
            "{} is dynamically linked (it names a program interpreter)",
            path.display()
        );
    }
    Ok(binary)
}

/// Whether the 64-bit little-endian ELF `elf` names a program interpreter (`PT_INTERP`): a
/// dynamically linked executable does, a static (or static-pie) one does not. `None` when `elf`
/// is not such a file.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let phoff = usize::try_from(u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let entry_size = usize::from(u16_at(0x36)?);
    let entries = usize::from(u16_at(0x38)?);
    for index in 0..entries {
        let at = phoff + index * entry_size;
        let kind = u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?);
        if kind == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_names_an_interpreter() {
        // The test binary itself is linked dynamically, as every default Rust build on glibc.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(has_interpreter(&me), Some(true));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
    }
}
