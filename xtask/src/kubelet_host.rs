//! The upstream kubelet as the benches run it next to ringlet: where its binary is, and what it
//! changes on the host (three sysctls, `KUBE-*` iptables chains, its directories and the pods'
//! `QoS` cgroups), recorded before it starts and put back when it stops, or by the next run of any
//! bench if that one was killed.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::benchkit::{Agent, free_port};
use crate::{cluster, cmd, lab};

/// The env variable naming the upstream kubelet binary (else envtest's `setup.sh` folder).
pub const KUBELET_ENV: &str = "KUBELET";
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

/// The upstream kubelet (`$KUBELET`, else envtest's folder) and its version, or why there is none.
pub fn find_kubelet() -> Result<(PathBuf, String), String> {
    let path = match std::env::var_os(KUBELET_ENV).filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => cluster::run_envtest_setup()
            .map_err(|e| format!("{KUBELET_ENV} is not set and envtest's setup.sh failed: {e:#}"))?
            .join("kubelet"),
    };
    let version = cmd::output(Command::new(&path).arg("--version"))
        .map_err(|e| format!("no upstream kubelet at {}: {e:#}", path.display()))?;
    Ok((path, version.trim().to_owned()))
}

/// Why the kubelet cannot start yet: containerd holds containers of others.
pub fn containers_of_others() -> Result<Option<String>> {
    let listing = cmd::output(lab::ctr().args(["containers", "ls", "-q"]))?;
    let count = listing.lines().filter(|l| !l.trim().is_empty()).count();
    Ok((count > 0).then(|| format!("containerd holds {count} containers of others")))
}

/// The upstream kubelet standalone (no API server) as node `node`: static pods from `manifests`,
/// the lab's containerd, `/pods` on the read-only port, everything it writes under `run_dir` and
/// `root_dir`.
pub fn spawn_standalone(
    kubelet: &Path,
    node: &str,
    run_dir: &Path,
    root_dir: &Path,
    manifests: &Path,
    read_only_port: u16,
) -> Result<Agent> {
    let config = run_dir.join("kubelet-config.yaml");
    fs::write(
        &config,
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
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
podLogsDir: {pod_logs}
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
            socket = ringlet_tests::CONTAINERD_SOCKET,
            manifests = manifests.display(),
            api_port = free_port()?,
            healthz_port = free_port()?,
            pod_logs = run_dir.join("pod-logs").display(),
            volume_plugins = run_dir.join("volume-plugins").display(),
        ),
    )?;
    Agent::spawn(
        Command::new(kubelet)
            .arg("--config")
            .arg(&config)
            .args(["--hostname-override", node])
            .arg("--root-dir")
            .arg(root_dir)
            .arg("--cert-dir")
            .arg(run_dir.join("pki")),
        run_dir.join("kubelet.log"),
    )
}

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
        .filter(|p| cmd::succeeds(Command::new(p).arg("--version")))
        .collect()
}

/// The chains of `table` (`-N` lines of `-S`; the built-in chains are `-P` lines).
fn iptables_chains(program: &str, table: &str) -> Result<Vec<String>> {
    Ok(
        cmd::output(Command::new(program).args(["-w", "-t", table, "-S"]))?
            .lines()
            .filter_map(|l| l.strip_prefix("-N "))
            .map(|c| c.trim().to_owned())
            .collect(),
    )
}

/// Deletes the rules of other chains that jump to `chains`, then flushes and deletes them.
fn remove_chains(program: &str, table: &str, chains: &HashSet<String>) -> Result<()> {
    if chains.is_empty() {
        return Ok(());
    }
    let rules = cmd::output(Command::new(program).args(["-w", "-t", table, "-S"]))?;
    for rule in rules.lines().filter_map(|l| l.strip_prefix("-A ")) {
        let words = split_rule(rule);
        let target = words
            .iter()
            .position(|w| w == "-j" || w == "-g")
            .and_then(|i| words.get(i + 1));
        let own_chain = words.first().is_some_and(|c| chains.contains(c));
        if !own_chain && target.is_some_and(|t| chains.contains(t)) {
            cmd::run(
                Command::new(program)
                    .args(["-w", "-t", table, "-D"])
                    .args(&words),
            )?;
        }
    }
    for flag in ["-F", "-X"] {
        for chain in chains {
            cmd::run(Command::new(program).args(["-w", "-t", table, flag, chain]))?;
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
        Path::new(lab::LAB_DIR).join("bench").join(HOST_STATE)
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
