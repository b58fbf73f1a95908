//! The upstream kubelet on the lab's containerd, standalone (static pods from a manifest directory,
//! `/pods` on the read-only port) or registered with an API server, as the benches and the
//! observe-mode tests run it: its configuration, the wait for a containerd it may have to itself,
//! and what it changes on the host (three sysctls, `KUBE-*` iptables chains, its directories and
//! the pods' `QoS` cgroups), recorded before it starts and put back when it stops, or by the next
//! run of any bench or test if that one was killed.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::cluster::run;
use crate::{CONTAINERD_SOCKET, LAB_DIR};

/// The env variable naming the upstream kubelet binary.
pub const KUBELET_ENV: &str = "KUBELET";
/// The envtest convention: a folder with `kube-apiserver`, `kubectl` and, here, `kubelet`.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// The upstream kubelet from `$KUBELET` or `$KUBEBUILDER_ASSETS/kubelet`, if either names one.
pub fn kubelet_from_env() -> Option<PathBuf> {
    let from = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    from(KUBELET_ENV)
        .map(PathBuf::from)
        .or_else(|| from(ASSETS_ENV).map(|dir| PathBuf::from(dir).join("kubelet")))
        .filter(|path| path.is_file())
}

/// The API server an upstream kubelet registers with as a node.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The node's kubeconfig (`--kubeconfig`).
    pub kubeconfig: PathBuf,
    /// The CA whose client certificates the kubelet API accepts (`authentication.x509`).
    pub client_ca_file: PathBuf,
}

/// The upstream kubelet for `test` ([`kubelet_from_env`]); `None` (SKIP, a failure under
/// `CI=true`) when there is none.
pub fn require_upstream_kubelet(test: &str) -> Option<PathBuf> {
    let kubelet = kubelet_from_env();
    let missing = kubelet.is_none().then(|| {
        format!(
            "no upstream kubelet: set {ASSETS_ENV} (envtest's setup.sh prints it) or {KUBELET_ENV}"
        )
    });
    crate::skip_unless(test, missing)
        .then_some(kubelet)
        .flatten()
}

/// The ports and directories of one upstream kubelet on the lab's containerd: standalone, or
/// registered with an API server.
#[derive(Clone, Debug)]
pub struct LabKubelet {
    /// `staticPodPath`.
    pub manifests: PathBuf,
    /// Where its configuration, pod logs, volume plugins and certificates go.
    pub run_dir: PathBuf,
    /// `--root-dir`, which [`LabKubelet::spawn`] makes a shared mount point: see [`unmount_below`].
    pub root_dir: PathBuf,
    pub read_only_port: u16,
    pub port: u16,
    pub healthz_port: u16,
    /// `None`: standalone, no API server; the kubelet API allows every request.
    pub registration: Option<Registration>,
    /// Turns its `EventedPLEG` feature gate on (it needs a runtime with the CRI event stream:
    /// containerd 1.7).
    pub evented_pleg: bool,
}

impl LabKubelet {
    /// Its `KubeletConfiguration`: ringlet's settings where they exist (cgroupfs, the lab's
    /// containerd, loopback ports; when registered, webhook authentication and authorization and
    /// the client CA), everything else default except what would reach outside the run directory
    /// or delete the lab's images.
    pub fn config(&self) -> String {
        let access = match &self.registration {
            None => "authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
"
            .to_owned(),
            Some(registration) => format!(
                "registerNode: true
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {}
authorization:
  mode: Webhook
",
                registration.client_ca_file.display()
            ),
        };
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These hosts are cgroup v1 (hybrid).
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{socket}
staticPodPath: {manifests}
address: 127.0.0.1
port: {api_port}
readOnlyPort: {read_only_port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
{access}{feature_gates}podLogsDir: {pod_logs}
volumePluginDir: {volume_plugins}
# There is no registry: an image the GC removed could not be pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Nor must its eviction manager reclaim them: with the disk of a build machine below its default
# 15 % imagefs threshold it deletes every unused image (a run lost busybox and pause that way).
evictionHard:
  imagefs.available: \"1%\"
  nodefs.available: \"1%\"
  memory.available: \"100Mi\"
",
            socket = CONTAINERD_SOCKET,
            feature_gates = if self.evented_pleg {
                "featureGates:\n  EventedPLEG: true\n"
            } else {
                ""
            },
            manifests = self.manifests.display(),
            api_port = self.port,
            read_only_port = self.read_only_port,
            healthz_port = self.healthz_port,
            pod_logs = self.run_dir.join("pod-logs").display(),
            volume_plugins = self.run_dir.join("volume-plugins").display(),
        )
    }

    /// Writes the configuration into the run directory and returns the command that starts
    /// `kubelet` with it as node `node`.
    pub fn command(&self, kubelet: &Path, node: &str) -> Result<Command> {
        let config = self.run_dir.join("kubelet-config.yaml");
        fs::write(&config, self.config())
            .with_context(|| format!("writing {}", config.display()))?;
        let mut command = Command::new(kubelet);
        command
            .arg("--config")
            .arg(&config)
            .args(["--hostname-override", node])
            .arg("--root-dir")
            .arg(&self.root_dir)
            // Its default is /var/lib/kubelet/pki whatever the root dir.
            .arg("--cert-dir")
            .arg(self.run_dir.join("pki"));
        if let Some(registration) = &self.registration {
            command.arg("--kubeconfig").arg(&registration.kubeconfig);
        }
        Ok(command)
    }
}

impl LabKubelet {
    /// Creates its manifest and root directories, makes the root directory a shared mount point
    /// and starts `kubelet` as node `node`, its output going to `kubelet.log` in the run directory.
    ///
    /// The kubelet bind-mounts a root directory that is not on a shared mount onto itself, in a
    /// goroutine that races the one creating its pod-resources socket below that directory: when
    /// the mount lands inside that socket's rename, the rename fails with EXDEV and the kubelet
    /// exits (seen once in CI). Sharing the directory first leaves the kubelet nothing to mount.
    pub fn spawn(&self, kubelet: &Path, node: &str) -> Result<std::process::Child> {
        fs::create_dir_all(&self.manifests)?;
        fs::create_dir_all(&self.root_dir)?;
        share_mount_point(&self.root_dir)?;
        let started = self.start(kubelet, node);
        if started.is_err() {
            let _ = unmount_below(&self.root_dir);
        }
        started
    }

    fn start(&self, kubelet: &Path, node: &str) -> Result<std::process::Child> {
        let log = fs::File::create(self.log_path())?;
        self.command(kubelet, node)?
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the upstream kubelet")
    }

    /// Where [`LabKubelet::spawn`] sends its output.
    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join("kubelet.log")
    }
}

/// Bind-mounts `dir` onto itself with shared propagation (`mount --bind` and `--make-rshared`),
/// as the kubelet does with its root directory; [`unmount_below`] undoes it.
fn share_mount_point(dir: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .with_context(|| format!("bind-mounting {} onto itself", dir.display()))?;
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .with_context(|| format!("making {} a shared mount", dir.display()))?;
    Ok(())
}

/// Containers (sandboxes included) in the lab's containerd, of any pod.
pub fn containers_in_containerd() -> Result<Vec<String>> {
    let out = run(Command::new("ctr")
        .args(["--address", CONTAINERD_SOCKET, "-n", "k8s.io"])
        .args(["containers", "ls", "-q"]))?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// How long the upstream kubelet may take to remove the containers of the pods it was told to
/// remove: their sandboxes go only at its container GC, which runs once a minute.
pub const POD_REMOVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(3);

/// Waits (bounded) until containerd holds no container: the upstream kubelet stops every
/// container it does not know, so it must not meet the pods of others.
pub fn wait_for_empty_containerd() -> Result<()> {
    crate::wait_for(
        "containerd to hold no containers",
        std::time::Duration::from_mins(1),
        || containers_in_containerd().ok()?.is_empty().then_some(()),
    )
    .with_context(|| {
        format!(
            "the upstream kubelet would kill the pods of others: {}",
            others()
        )
    })
}

/// The pods whose containers containerd holds, for the message that refuses to start the kubelet.
fn others() -> String {
    let mut pods: Vec<String> = containers_in_containerd()
        .unwrap_or_default()
        .iter()
        .filter_map(|id| {
            let labels = crate::container_labels(id).ok()?;
            Some(format!(
                "{}/{}",
                labels["io.kubernetes.pod.namespace"].as_str()?,
                labels["io.kubernetes.pod.name"].as_str()?
            ))
        })
        .collect();
    pods.sort();
    pods.dedup();
    pods.join(", ")
}

/// Unmounts everything mounted at or below `dir`, deepest first (the upstream kubelet bind-mounts
/// its root dir onto itself, shared, and leaves it), so a removal never reaches into a mount.
pub fn unmount_below(dir: &Path) -> Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    // Deepest first; a point mounted twice is listed twice and unmounted twice.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        run(Command::new("umount").arg(mount))?;
    }
    Ok(())
}

/// What the upstream kubelet changes on the host when it starts (`/proc/sys` paths).
const KUBELET_SYSCTLS: [&str; 3] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
];
/// Directories the kubelet creates whatever its root dir, children before parents.
const KUBELET_DIRS: [&str; 3] = [
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
    "/var/log/containers",
];
/// The pods' `QoS` cgroups below each v1 hierarchy (`/sys/fs/cgroup/<controller>`), children first.
const QOS_CGROUPS: [&str; 3] = ["kubepods/besteffort", "kubepods/burstable", "kubepods"];
const IPTABLES: [&str; 2] = ["iptables", "ip6tables"];
const IPTABLES_TABLES: [&str; 3] = ["filter", "nat", "mangle"];
/// The host state recorded before the kubelet starts, in the lab's bench directory.
const HOST_STATE: &str = "kubelet-host.json";

/// What the upstream kubelet changes on the host, as it was before it started.
#[derive(Serialize, Deserialize)]
struct HostState {
    /// `/proc/sys` path and value.
    sysctls: Vec<(String, String)>,
    /// (program, table, chain) of every iptables chain there was.
    chains: Vec<(String, String, String)>,
    /// Directories (cgroups included) the kubelet creates that did not exist, children first.
    missing: Vec<PathBuf>,
}

impl HostState {
    fn read() -> Result<Self> {
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|key| {
                let value = fs::read_to_string(Path::new("/proc/sys").join(key))
                    .with_context(|| format!("reading sysctl {key}"))?;
                Ok(((*key).to_owned(), value.trim().to_owned()))
            })
            .collect::<Result<_>>()?;
        let mut chains = Vec::new();
        for program in iptables_programs() {
            for table in IPTABLES_TABLES {
                for chain in iptables_chains(program, table)? {
                    chains.push((program.to_owned(), table.to_owned(), chain));
                }
            }
        }
        let missing = kubelet_dirs()?
            .into_iter()
            .filter(|d| !d.exists())
            .collect();
        Ok(Self {
            sysctls,
            chains,
            missing,
        })
    }

    /// Puts back what changed since [`HostState::read`]: sysctl values, `KUBE-*` chains that were
    /// not there (with the rules jumping to them), directories that were not there.
    fn restore(&self) -> Result<()> {
        for (key, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(key);
            fs::write(&path, value).with_context(|| format!("restoring sysctl {key}={value}"))?;
        }
        for program in iptables_programs() {
            for table in IPTABLES_TABLES {
                let before: HashSet<&str> = self
                    .chains
                    .iter()
                    .filter(|(p, t, _)| p == program && t == table)
                    .map(|(_, _, c)| c.as_str())
                    .collect();
                let added: HashSet<String> = iptables_chains(program, table)?
                    .into_iter()
                    .filter(|c| c.starts_with("KUBE-") && !before.contains(c.as_str()))
                    .collect();
                remove_chains(program, table, &added)?;
            }
        }
        for dir in &self.missing {
            if !dir.exists() {
                continue;
            }
            // The device-plugin directory holds only the kubelet's socket; everything else must
            // be empty by now (a cgroup with tasks or children refuses, and is reported).
            let removed = if dir.ends_with("device-plugins") {
                fs::remove_dir_all(dir)
            } else {
                fs::remove_dir(dir)
            };
            removed.with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(())
    }
}

/// The kubelet's directories and the `QoS` cgroups below every v1 hierarchy, children first.
fn kubelet_dirs() -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = KUBELET_DIRS.iter().map(PathBuf::from).collect();
    for hierarchy in fs::read_dir("/sys/fs/cgroup").context("listing /sys/fs/cgroup")? {
        let hierarchy = hierarchy?.path();
        if hierarchy.join("cgroup.procs").exists() {
            dirs.extend(QOS_CGROUPS.iter().map(|c| hierarchy.join(c)));
        }
    }
    Ok(dirs)
}

fn iptables_programs() -> Vec<&'static str> {
    IPTABLES
        .into_iter()
        .filter(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
}

/// The chains of `table` (`-N` lines of `-S`; the built-in chains are `-P` lines).
fn iptables_chains(program: &str, table: &str) -> Result<Vec<String>> {
    Ok(run(Command::new(program).args(["-w", "-t", table, "-S"]))?
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .map(|c| c.trim().to_owned())
        .collect())
}

/// Deletes the rules of other chains that jump to `chains`, then flushes and deletes them.
fn remove_chains(program: &str, table: &str, chains: &HashSet<String>) -> Result<()> {
    if chains.is_empty() {
        return Ok(());
    }
    let rules = run(Command::new(program).args(["-w", "-t", table, "-S"]))?;
    for rule in rules.lines().filter_map(|l| l.strip_prefix("-A ")) {
        let words = split_rule(rule);
        let target = words
            .iter()
            .position(|w| w == "-j" || w == "-g")
            .and_then(|i| words.get(i + 1));
        let own_chain = words.first().is_some_and(|c| chains.contains(c));
        if !own_chain && target.is_some_and(|t| chains.contains(t)) {
            run(Command::new(program)
                .args(["-w", "-t", table, "-D"])
                .args(&words))?;
        }
    }
    for flag in ["-F", "-X"] {
        for chain in chains {
            run(Command::new(program).args(["-w", "-t", table, flag, chain]))?;
        }
    }
    println!(
        "{program} -t {table}: removed the kubelet's chains {}",
        chains.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// The words of an `iptables -S` rule; a comment in double quotes is one word.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => word.extend(chars.next()),
            c if c.is_whitespace() && !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// The host as it was before the kubelet started, put back when dropped; also on disk, so a run
/// that was killed is repaired by the next one.
pub struct HostGuard {
    state: HostState,
    restored: bool,
}

impl HostGuard {
    fn state_path() -> PathBuf {
        Path::new(LAB_DIR).join("bench").join(HOST_STATE)
    }

    pub fn take() -> Result<Self> {
        let path = Self::state_path();
        if let Ok(text) = fs::read_to_string(&path) {
            println!(
                "{} is left from a run that was killed: restoring it",
                path.display()
            );
            let earlier: HostState = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            earlier.restore()?;
        }
        let state = HostState::read()?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&path, serde_json::to_vec_pretty(&state)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            state,
            restored: false,
        })
    }

    pub fn restore(mut self) -> Result<()> {
        self.restored = true;
        self.state.restore()?;
        fs::remove_file(Self::state_path())?;
        println!("host settings the kubelet changed are restored");
        Ok(())
    }
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        if !self.restored && self.state.restore().is_ok() {
            let _ = fs::remove_file(Self::state_path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_comment_is_one_word() {
        assert_eq!(
            split_rule(
                r#"KUBE-FIREWALL ! -s 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP"#
            ),
            [
                "KUBE-FIREWALL",
                "!",
                "-s",
                "127.0.0.0/8",
                "-m",
                "comment",
                "--comment",
                "block incoming localnet connections",
                "-j",
                "DROP"
            ]
        );
    }
}
