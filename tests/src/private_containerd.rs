//! A containerd of a test's own, for tests that fill or empty an image filesystem and so must not
//! touch the lab's (whose busybox and pause images every other test needs): the lab's containerd
//! binary and configuration with their own socket and state directory, and a root directory on a
//! small ext4 filesystem loop-mounted from a file, so "the image filesystem is 85 % full" is a
//! few megabytes away. Images come from the lab's archives or [`throwaway_image`].
//!
//! Dropping it removes everything it made even after a failure: its pods (through CRI), the
//! daemon and its shims, the mounts below its directory, the loop device and the files.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{LAB_DIR, kubelet_host, lab_containerd, wait_for};

/// How long containerd gets to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped containerd gets before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running private containerd; see the module documentation.
pub struct PrivateContainerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    mounted: bool,
}

impl PrivateContainerd {
    /// Makes a `size_mib` ext4 filesystem (no blocks reserved for root, so its free space is
    /// what statfs calls available), mounts it as the root of a new containerd and starts that.
    pub fn start(size_mib: u64) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ringlet-private-containerd-")
            .tempdir()?;
        let mut this = Self {
            dir,
            child: None,
            mounted: false,
        };
        let image = this.dir.path().join("root.ext4");
        fs::File::create(&image)?.set_len(size_mib * 1024 * 1024)?;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-m", "0"])
            .arg(&image))?;
        fs::create_dir(this.root())?;
        // `mount -o loop` sets the loop device up with autoclear: unmounting frees it.
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(this.root()))?;
        this.mounted = true;
        fs::write(this.config_path(), this.config()?)?;
        let log = fs::File::create(this.log_path())?;
        let binary = lab_binary()?;
        this.child = Some(
            Command::new(&binary)
                .arg("--config")
                .arg(this.config_path())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
        let answered = wait_for("the private containerd", START_TIMEOUT, || {
            this.ctr()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
                .then_some(())
        });
        if let Err(err) = answered {
            bail!("{err:#}; its log:\n{}", this.log());
        }
        Ok(this)
    }

    /// The filesystem containerd keeps its images in (its `root`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("containerd.toml")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }

    /// containerd's log so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The lab's configuration with this daemon's socket, root and state.
    fn config(&self) -> Result<String> {
        let lab_config = Path::new(LAB_DIR).join("containerd.toml");
        let lab = fs::read_to_string(&lab_config).with_context(|| {
            format!(
                "reading {} (run `cargo xtask lab up`)",
                lab_config.display()
            )
        })?;
        let lab_address = format!("address = \"{}\"", crate::CONTAINERD_SOCKET);
        if !lab.contains(&lab_address) {
            bail!("{} does not set {lab_address}", lab_config.display());
        }
        let config = lab.replacen(
            &lab_address,
            &format!("address = \"{}\"", self.socket().display()),
            1,
        );
        // Top-level keys go before the first table.
        let (first, rest) = config.split_once('\n').unwrap_or((&config, ""));
        Ok(format!(
            "{first}\nroot = \"{}\"\nstate = \"{}\"\n{rest}",
            self.root().display(),
            self.state().display()
        ))
    }

    /// `ctr` talking to this containerd in the CRI namespace.
    pub fn ctr(&self) -> Command {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(self.socket()).args([
            "--connect-timeout",
            "2s",
            "--namespace",
            "k8s.io",
        ]);
        command
    }

    /// Imports an image archive (OCI layout tar), e.g. one of the lab's under
    /// `/var/lib/ringlet-lab/images`.
    pub fn import(&self, archive: &Path) -> Result<()> {
        run(self.ctr().args(["images", "import"]).arg(archive))
    }

    /// Imports one of the lab's image archives by file name.
    pub fn import_lab_image(&self, file_name: &str) -> Result<()> {
        self.import(&Path::new(LAB_DIR).join("images").join(file_name))
    }

    /// Image names (`ctr images ls -q`).
    pub fn image_names(&self) -> Result<Vec<String>> {
        let out = output(self.ctr().args(["images", "ls", "-q"]))?;
        Ok(out.lines().map(str::to_owned).collect())
    }

    /// Capacity and available bytes of the image filesystem, as statfs reports them.
    pub fn fs_usage(&self) -> Result<FsUsage> {
        let stat = nix::sys::statvfs::statvfs(&self.root())?;
        let block = stat.fragment_size();
        Ok(FsUsage {
            capacity: stat.blocks() * block,
            available: stat.blocks_available() * block,
        })
    }

    /// Writes `bytes` of zeros to a file on the image filesystem (not containerd's), synced, so
    /// the filesystem is fuller by that much.
    pub fn fill(&self, name: &str, bytes: u64) -> Result<()> {
        let path = self.root().join(name);
        let mut file = fs::File::create(&path)?;
        let chunk = vec![0_u8; 1024 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(chunk.len() as u64))?;
            file.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        file.sync_all()?;
        Ok(())
    }

    /// Stops and removes every pod sandbox (and so every container) through CRI.
    fn remove_pods(&self) -> Result<()> {
        let socket = self.socket();
        let remove = move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = ringlet::kuberuntime::CriClient::new(
                    &socket.display().to_string(),
                    Duration::from_mins(1),
                )?;
                for sandbox in client.list_pod_sandbox(None).await? {
                    client.stop_pod_sandbox(&sandbox.id).await?;
                    client.remove_pod_sandbox(&sandbox.id).await?;
                }
                Ok(())
            })
        };
        std::thread::spawn(remove)
            .join()
            .map_err(|_| anyhow::anyhow!("removing the pods panicked"))?
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        crate::daemon::signal(child.id(), libc::SIGTERM);
        let stopped = wait_for("the private containerd to stop", STOP_TIMEOUT, || {
            child.try_wait().ok().flatten()
        });
        if stopped.is_err() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    /// Kills the shims this containerd started (their command line names its socket).
    fn kill_shims(&self) {
        let socket = self.socket().display().to_string();
        let Ok(entries) = fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("containerd-shim") && cmdline.contains(&socket) {
                crate::daemon::signal(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Err(err) = self.remove_pods()
        {
            eprintln!("removing the private containerd's pods: {err:#}");
        }
        self.stop();
        self.kill_shims();
        if let Err(err) = kubelet_host::unmount_below(self.dir.path()) {
            eprintln!("unmounting below {}: {err:#}", self.dir.path().display());
            // A lazy unmount still frees the loop device once the last user is gone.
            if self.mounted {
                let _ = Command::new("umount").arg("-l").arg(self.root()).status();
            }
        }
    }
}

/// Size and free space of a filesystem, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

impl FsUsage {
    /// Usage in percent as the kubelet's image GC computes it (rounded up).
    pub fn percent(&self) -> u64 {
        100 - self.available * 100 / self.capacity
    }
}

/// The binary the lab's containerd runs (bookworm's or trixie's).
fn lab_binary() -> Result<PathBuf> {
    let command_line = lab_containerd()
        .command_line()?
        .context("the lab's containerd is not running (run `cargo xtask lab up`)")?;
    command_line
        .first()
        .map(PathBuf::from)
        .context("the lab containerd's command line is empty")
}

/// An image [`throwaway_image`] wrote.
#[derive(Debug, Clone)]
pub struct ThrowawayImage {
    /// The image id a runtime gives it: its config's digest.
    pub id: String,
    /// Its content's bytes (manifest, config and layer), the size containerd reports.
    pub size: u64,
}

/// An image of `junk_mib` MiB of random (incompressible) bytes plus busybox, so a container of
/// it can run `sleep`; written as an OCI layout tar for `ctr images import` at `path`.
pub fn throwaway_image(name: &str, junk_mib: usize, path: &Path) -> Result<ThrowawayImage> {
    let mut junk = vec![0_u8; junk_mib * 1024 * 1024];
    fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut junk))
        .context("reading /dev/urandom")?;
    let busybox = fs::read("/bin/busybox").context("reading /bin/busybox (busybox-static)")?;
    let mut layer = tar::Builder::new(Vec::new());
    append(&mut layer, tar::EntryType::Directory, "bin/", 0o755, &[])?;
    append(
        &mut layer,
        tar::EntryType::Regular,
        "bin/busybox",
        0o755,
        &busybox,
    )?;
    for applet in ["sh", "sleep"] {
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        layer.append_link(&mut header, format!("bin/{applet}"), "busybox")?;
    }
    append(&mut layer, tar::EntryType::Regular, "junk", 0o644, &junk)?;
    let layer = layer.into_inner()?;
    let config = serde_json::to_vec(&json!({
        "architecture": oci_architecture(),
        "os": "linux",
        "config": { "Env": ["PATH=/bin"], "Cmd": ["sh"] },
        "rootfs": { "type": "layers", "diff_ids": [sha256(&layer)] },
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
    }))?;
    let mut manifest_descriptor = descriptor(MANIFEST, &manifest);
    manifest_descriptor["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit_once(':').map_or("latest", |(_, tag)| tag),
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;
    let mut archive = tar::Builder::new(fs::File::create(path)?);
    append(
        &mut archive,
        tar::EntryType::Regular,
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    append(
        &mut archive,
        tar::EntryType::Regular,
        "index.json",
        0o644,
        &index,
    )?;
    append(
        &mut archive,
        tar::EntryType::Directory,
        "blobs/",
        0o755,
        &[],
    )?;
    append(
        &mut archive,
        tar::EntryType::Directory,
        "blobs/sha256/",
        0o755,
        &[],
    )?;
    for blob in [&layer, &config, &manifest] {
        let digest = sha256(blob);
        let hex = digest.trim_start_matches("sha256:");
        append(
            &mut archive,
            tar::EntryType::Regular,
            &format!("blobs/sha256/{hex}"),
            0o644,
            blob,
        )?;
    }
    archive.into_inner()?.sync_all()?;
    Ok(ThrowawayImage {
        id: sha256(&config),
        size: (layer.len() + config.len() + manifest.len()) as u64,
    })
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header
}

fn append<W: std::io::Write>(
    builder: &mut tar::Builder<W>,
    kind: tar::EntryType,
    path: &str,
    mode: u32,
    data: &[u8],
) -> Result<()> {
    let mut header = header(kind, mode, data.len() as u64);
    builder
        .append_data(&mut header, path, data)
        .with_context(|| format!("adding {path} to an image"))
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": sha256(blob), "size": blob.len() })
}

fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn run(command: &mut Command) -> Result<()> {
    output(command).map(drop)
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
