//! The lab: a real containerd with CRI on this machine, set up without systemd or a public registry. `up`
//! installs the packages, builds the busybox and pause images in Rust and imports them (and the
//! agent's image when `cargo xtask image` built it), writes the containerd and CNI configuration and
//! starts containerd; every step is skipped when already done. It runs Debian bookworm's containerd
//! 1.6 unless told to run trixie's 1.7 (`--containerd 1.7`, unpacked under the lab directory: 1.7
//! has the CRI event stream that the kubelet's Evented PLEG reads). `--registry` adds a private
//! image registry (`lab_registry`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::oci::{self, ImageSpec, Layer};

/// containerd's standard socket, the agent's default `--container-runtime-endpoint`.
pub use ringlet_tests::CONTAINERD_SOCKET as SOCKET;
/// Where the lab keeps its configuration, log, pid file, images and build outputs.
pub use ringlet_tests::LAB_DIR;
pub const BUSYBOX_REFS: &[&str] = &[
    "docker.io/library/busybox:latest",
    "docker.io/library/busybox:1.35",
];
pub const PAUSE_REF: &str = "registry.k8s.io/pause:3.10";

const PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "iptables",
    "iproute2",
    "clang",
    "libbpf-dev",
    "bpftool",
    "gcc",
    "libc6-dev",
    "curl",
    // The CA bundle `cargo xtask image` puts into ringlet's image.
    "ca-certificates",
    "prometheus",
    // etcd for the control plane (`cargo xtask cluster up`). Its package ships an init script
    // that would start an etcd on 2379; without systemd, or under Docker's policy-rc.d, it does
    // not, and the control plane's own etcd listens elsewhere either way.
    "etcd-server",
];
const CNI_CONFLIST: &str = "/etc/cni/net.d/10-ringlet-lab.conflist";
const CONTAINERD_START_TIMEOUT: Duration = Duration::from_secs(30);
const CONTAINERD_STOP_TIMEOUT: Duration = Duration::from_secs(15);
pub(crate) const PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const PAUSE_SOURCE: &str = include_str!("pause.c");
/// The Debian suite whose containerd package is 1.7.
const TRIXIE_SOURCE: &str = "deb http://deb.debian.org/debian trixie main";

/// The containerd releases the lab can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Containerd {
    /// Debian bookworm's package, installed with the others: the lab's default.
    #[value(name = "1.6")]
    Bookworm,
    /// Debian trixie's package, unpacked under the lab directory.
    #[value(name = "1.7")]
    Trixie,
}

impl Containerd {
    /// The release series, as the start of containerd's version.
    pub fn series(self) -> &'static str {
        match self {
            Self::Bookworm => "1.6",
            Self::Trixie => "1.7",
        }
    }
}

pub(crate) fn lab_path(name: &str) -> PathBuf {
    Path::new(LAB_DIR).join(name)
}

/// `ctr` talking to the lab's containerd in the CRI namespace.
pub fn ctr() -> Command {
    let mut c = Command::new("ctr");
    c.args([
        "--address",
        SOCKET,
        "--connect-timeout",
        "2s",
        "--namespace",
        "k8s.io",
    ]);
    c
}

/// Brings the lab up with whichever containerd it runs (bookworm's when none does).
pub fn up() -> Result<()> {
    up_with(None)
}

/// Brings the lab up; with `containerd`, a lab containerd of another release is stopped first and
/// that one started (running pods keep their shims).
pub fn up_with(containerd: Option<Containerd>) -> Result<()> {
    cmd::ensure_root("the lab")?;
    install_packages()?;
    mount_kernel_filesystems()?;
    fs::create_dir_all(LAB_DIR).with_context(|| format!("creating {LAB_DIR}"))?;
    if let Some(wanted) = containerd {
        stop_other_release(wanted)?;
    }
    let (binary, (config, config_changed)) = match containerd.unwrap_or(Containerd::Bookworm) {
        Containerd::Bookworm => (
            PathBuf::from("containerd"),
            write_containerd_config("containerd.toml", None)?,
        ),
        Containerd::Trixie => {
            let bin = unpack_trixie_containerd()?;
            let config = write_containerd_config(
                "containerd-1.7.toml",
                Some(&bin.join("containerd-shim-runc-v2")),
            )?;
            (bin.join("containerd"), config)
        }
    };
    if config_changed {
        restart_for_new_config()?;
    }
    write_cni_config()?;
    let images = build_images()?;
    start_containerd(&binary, &config)?;
    import_images(&images)?;
    // The agent's own image, when `cargo xtask image` built it (the tests of the image need it).
    crate::image::import_if_built()?;
    println!("lab is up: containerd on {SOCKET}, lab files in {LAB_DIR}");
    Ok(())
}

/// containerd reads its configuration only when it starts: a lab containerd that runs with an
/// older one is stopped, and started again with the new one (running pods keep their shims).
fn restart_for_new_config() -> Result<()> {
    if let Some(pid) = ringlet_tests::lab_containerd().stop(CONTAINERD_STOP_TIMEOUT)? {
        println!("containerd {pid} stopped to start again with its new configuration");
    } else if containerd_answers() {
        println!(
            "a containerd that `lab up` did not start answers on {SOCKET}: it keeps its old \
             configuration until it is restarted"
        );
    }
    Ok(())
}

pub fn down() -> Result<()> {
    cmd::ensure_root("the lab")?;
    crate::lab_registry::down()?;
    match ringlet_tests::lab_containerd().stop(CONTAINERD_STOP_TIMEOUT)? {
        Some(pid) => println!(
            "containerd {pid} stopped; running pods keep their shims and are picked up again by the next `lab up`"
        ),
        None => println!("no containerd started by `lab up` is running"),
    }
    Ok(())
}

pub fn status() -> Result<()> {
    println!("packages:");
    for package in PACKAGES {
        let state = if package_installed(package) {
            "installed"
        } else {
            "MISSING"
        };
        println!("  {package:<28} {state}");
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    for (fstype, target) in [("tracefs", "/sys/kernel/tracing"), ("bpf", "/sys/fs/bpf")] {
        let state = if is_mounted(&mounts, fstype, target) {
            "mounted"
        } else {
            "NOT mounted"
        };
        println!("{fstype} at {target}: {state}");
    }
    let cni = if Path::new(CNI_CONFLIST).exists() {
        "present"
    } else {
        "MISSING"
    };
    println!("CNI config {CNI_CONFLIST}: {cni}");
    crate::lab_registry::status();
    match ringlet_tests::lab_containerd().running_pid()? {
        Some(pid) => println!("containerd started by `lab up`: pid {pid}"),
        None => println!("containerd started by `lab up`: none"),
    }
    if !containerd_answers() {
        println!("containerd on {SOCKET}: NOT answering");
        return Ok(());
    }
    println!("containerd on {SOCKET}: answering ({})", server_version()?);
    println!("images in namespace k8s.io:");
    for (name, digest) in image_digests()? {
        if !name.starts_with("sha256:") {
            println!("  {name}  {digest}");
        }
    }
    Ok(())
}

fn package_installed(package: &str) -> bool {
    let Ok(out) = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
    else {
        return false;
    };
    out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with("install ok installed")
}

fn install_packages() -> Result<()> {
    ensure_packages(PACKAGES)
}

/// Installs those of Debian's `packages` that are missing.
pub(crate) fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !package_installed(p))
        .collect();
    if missing.is_empty() {
        println!("packages: all installed");
        return Ok(());
    }
    println!("packages: installing {}", missing.join(" "));
    cmd::run(
        Command::new("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn is_mounted(mounts: &str, fstype: &str, target: &str) -> bool {
    mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let (_, mountpoint, kind) = (fields.next(), fields.next(), fields.next());
        mountpoint == Some(target) && kind == Some(fstype)
    })
}

/// The eBPF PLEG needs tracefs (tracepoint ids) and bpffs (pinned maps).
fn mount_kernel_filesystems() -> Result<()> {
    let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    for (fstype, target) in [("tracefs", "/sys/kernel/tracing"), ("bpf", "/sys/fs/bpf")] {
        if !is_mounted(&mounts, fstype, target) {
            fs::create_dir_all(target).with_context(|| format!("creating {target}"))?;
            cmd::run(Command::new("mount").args(["-t", fstype, fstype, target]))?;
            println!("mounted {fstype} at {target}");
        }
    }
    Ok(())
}

/// Writes `contents` to `path` unless it already holds exactly that; says whether it wrote.
pub(crate) fn write_if_changed(path: &Path, contents: &[u8]) -> Result<bool> {
    if fs::read(path).is_ok_and(|old| old == contents) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

/// The version of the containerd answering on the lab's socket (`Version:` under `Server:` of
/// `ctr version`, without a `v` prefix, e.g. `1.6.20~ds1`).
pub fn server_version() -> Result<String> {
    let version = cmd::output(ctr().arg("version"))?;
    Ok(version
        .split("Server:")
        .nth(1)
        .and_then(|s| s.lines().find(|l| l.trim_start().starts_with("Version:")))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, v)| v.trim())
        .trim_start_matches('v')
        .to_owned())
}

/// Stops the lab's containerd when it is not of the `wanted` release; refuses to go on when a
/// containerd the lab did not start answers on its socket.
fn stop_other_release(wanted: Containerd) -> Result<()> {
    if !containerd_answers() {
        return Ok(());
    }
    let running = server_version()?;
    if running.starts_with(wanted.series()) {
        return Ok(());
    }
    match ringlet_tests::lab_containerd().stop(CONTAINERD_STOP_TIMEOUT)? {
        Some(pid) => println!(
            "containerd {running} (pid {pid}) stopped for {}",
            wanted.series()
        ),
        None => bail!(
            "containerd {running} answers on {SOCKET} but `lab up` did not start it; stop it \
             before asking for containerd {}",
            wanted.series()
        ),
    }
    Ok(())
}

/// Downloads trixie's containerd package (once) and unpacks it under the lab directory; returns
/// the directory holding its `containerd` and `containerd-shim-runc-v2`. apt reads the trixie
/// suite through its own lists there, so the machine's sources stay as they are.
fn unpack_trixie_containerd() -> Result<PathBuf> {
    let dir = lab_path("containerd-1.7");
    let bin = dir.join("root/usr/bin");
    if bin.join("containerd").exists() {
        return Ok(bin);
    }
    let lists = dir.join("lists");
    fs::create_dir_all(lists.join("partial"))
        .with_context(|| format!("creating {}", lists.display()))?;
    let sources = dir.join("trixie.list");
    fs::write(&sources, format!("{TRIXIE_SOURCE}\n"))
        .with_context(|| format!("writing {}", sources.display()))?;
    let apt = |action: &[&str]| {
        let mut c = Command::new("apt-get");
        c.current_dir(&dir)
            .arg("-o")
            .arg(format!("Dir::Etc::sourcelist={}", sources.display()))
            .args([
                "-o",
                "Dir::Etc::sourceparts=-",
                "-o",
                "APT::Sandbox::User=root",
            ])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", lists.display()))
            .args(action);
        c
    };
    cmd::run(&mut apt(&["update"]))?;
    cmd::run(&mut apt(&["download", "containerd"]))?;
    let package = fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("containerd_"))
        })
        .with_context(|| {
            format!(
                "apt-get download left no containerd package in {}",
                dir.display()
            )
        })?;
    cmd::run(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&package)
            .arg(dir.join("root")),
    )?;
    println!(
        "unpacked {} into {}",
        package.display(),
        dir.join("root").display()
    );
    Ok(bin)
}

/// The lab's containerd configuration; `shim` names the runc shim to run instead of the one on
/// `PATH` (bookworm's 1.6 shim, which trixie's 1.7 must not pick up).
fn containerd_config(shim: Option<&Path>) -> String {
    let runtime_path = shim.map_or_else(String::new, |shim| {
        format!("  runtime_path = \"{}\"\n", shim.display())
    });
    // restrict_oom_score_adj: this VM's bounding set lacks CAP_SYS_RESOURCE, so runc cannot lower
    // oom_score_adj and every sandbox would fail with "can't get final child's PID from pipe: EOF".
    format!(
        r#"version = 2

[grpc]
  address = "{SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_REF}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  systemd_cgroup = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{runtime_path}
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"

# Per-registry hosts.toml files (the lab registry's CA), read at every pull.
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "{hosts_dir}"
"#,
        hosts_dir = ringlet_tests::registry::hosts_dir().display()
    )
}

/// Writes the configuration; returns its path and whether it changed.
fn write_containerd_config(name: &str, shim: Option<&Path>) -> Result<(PathBuf, bool)> {
    let path = lab_path(name);
    let changed = write_if_changed(&path, containerd_config(shim).as_bytes())?;
    if changed {
        println!("wrote {}", path.display());
    }
    Ok((path, changed))
}

fn write_cni_config() -> Result<()> {
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "ringlet-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": "10.88.0.0/16" }]],
                    "routes": [{ "dst": "0.0.0.0/0" }]
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    });
    let bytes = serde_json::to_vec_pretty(&conflist)?;
    if write_if_changed(Path::new(CNI_CONFLIST), &bytes)? {
        println!("wrote {CNI_CONFLIST}");
    }
    Ok(())
}

struct BuiltImage {
    refs: Vec<&'static str>,
    archive: oci::Archive,
}

fn build_images() -> Result<Vec<BuiltImage>> {
    Ok(vec![
        BuiltImage {
            refs: BUSYBOX_REFS.to_vec(),
            archive: busybox_image()?,
        },
        BuiltImage {
            refs: vec![PAUSE_REF],
            archive: pause_image(&[PAUSE_REF])?,
        },
    ])
}

fn busybox_image() -> Result<oci::Archive> {
    let binary = fs::read("/bin/busybox").context("reading /bin/busybox (busybox-static)")?;
    let applets = cmd::output(Command::new("/bin/busybox").arg("--list"))?;
    let mut layer = Layer::new();
    for (dir, mode) in [
        ("bin/", 0o755),
        ("etc/", 0o755),
        ("home/", 0o755),
        ("root/", 0o700),
        ("tmp/", 0o1777),
        ("var/", 0o755),
    ] {
        layer.dir(dir, mode)?;
    }
    layer.file("bin/busybox", 0o755, &binary)?;
    let mut names: Vec<&str> = applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .collect();
    names.sort_unstable();
    names.dedup();
    for applet in names {
        layer.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    layer.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
    )?;
    layer.file("etc/group", 0o644, b"root:x:0:\nnobody:x:65534:\n")?;
    oci::build(
        layer,
        &ImageSpec {
            refs: BUSYBOX_REFS,
            entrypoint: None,
            cmd: Some(&["sh"]),
            env: &[PATH_ENV],
            created_by: "cargo xtask lab up",
        },
    )
}

/// Compiles the C program `source` statically as `<lab>/<name>/<name>` once; later runs reuse the
/// binary while the source is unchanged.
pub(crate) fn static_binary(name: &str, source: &str) -> Result<Vec<u8>> {
    let dir = lab_path(name);
    let source_path = dir.join(format!("{name}.c"));
    let binary = dir.join(name);
    if write_if_changed(&source_path, source.as_bytes())? || !binary.exists() {
        cmd::run(
            Command::new("gcc")
                .args(["-Os", "-static", "-s", "-o"])
                .arg(&binary)
                .arg(&source_path),
        )?;
        println!("built {}", binary.display());
    }
    fs::read(&binary).with_context(|| format!("reading {}", binary.display()))
}

/// The pause image (the lab's sandbox image) under `refs`.
pub(crate) fn pause_image(refs: &[&str]) -> Result<oci::Archive> {
    let mut layer = Layer::new();
    layer.file("pause", 0o755, &static_binary("pause", PAUSE_SOURCE)?)?;
    oci::build(
        layer,
        &ImageSpec {
            refs,
            entrypoint: Some(&["/pause"]),
            cmd: None,
            env: &[PATH_ENV],
            created_by: "cargo xtask lab up",
        },
    )
}

/// Image name -> manifest digest, as `ctr images ls` shows them.
pub(crate) fn image_digests() -> Result<HashMap<String, String>> {
    let listing = cmd::output(ctr().args(["images", "ls"]))?;
    Ok(listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            let digest = fields.nth(1)?;
            Some((name.to_owned(), digest.to_owned()))
        })
        .collect())
}

fn import_images(images: &[BuiltImage]) -> Result<()> {
    for image in images {
        import_image(&image.refs, &image.archive)?;
    }
    Ok(())
}

/// Keeps `archive` under the lab's `images/`, named after the first of `refs`, and imports it
/// unless containerd already has it under every one of `refs`.
pub(crate) fn import_image(refs: &[&str], archive: &oci::Archive) -> Result<()> {
    let file_name = refs[0].replace(['/', ':'], "_") + ".oci.tar";
    let path = lab_path("images").join(file_name);
    write_if_changed(&path, &archive.tar)?;
    import_archive(refs, &archive.manifest_digest, &path)
}

/// Imports the image-layout tar at `path` into the lab's containerd unless every one of `refs`
/// already names the manifest `digest`.
pub fn import_archive(refs: &[&str], digest: &str, path: &Path) -> Result<()> {
    let present = image_digests()?;
    if refs
        .iter()
        .all(|r| present.get(*r).is_some_and(|d| d == digest))
    {
        println!("images: {} already imported", refs.join(", "));
        return Ok(());
    }
    cmd::run(ctr().args(["images", "import"]).arg(path))?;
    println!("images: imported {}", refs.join(", "));
    Ok(())
}

pub fn containerd_answers() -> bool {
    Path::new(SOCKET).exists() && cmd::succeeds(ctr().arg("version"))
}

fn start_containerd(binary: &Path, config: &Path) -> Result<()> {
    ringlet_tests::lab_containerd().start(
        binary,
        &["--config".to_owned(), config.display().to_string()],
        containerd_answers,
        CONTAINERD_START_TIMEOUT,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only trixie's containerd names its shim; bookworm's configuration stays as it was.
    #[test]
    fn the_shim_path_is_set_only_when_given() {
        let bookworm = containerd_config(None);
        assert!(!bookworm.contains("runtime_path"));
        assert!(bookworm.contains("runtime_type = \"io.containerd.runc.v2\"\n\n[plugins"));
        let trixie = containerd_config(Some(Path::new("/lab/bin/containerd-shim-runc-v2")));
        assert!(trixie.contains(
            "runtime_type = \"io.containerd.runc.v2\"\n  runtime_path = \"/lab/bin/containerd-shim-runc-v2\"\n"
        ));
    }
}
