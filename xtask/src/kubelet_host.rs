//! The upstream kubelet as the benches run it next to ringlet: where its binary is and how it is
//! started. Its configuration and what it changes on the host (recorded and put back by
//! [`HostGuard`]) live in the tests crate, which the observe-mode test shares them from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
pub use ringlet_tests::kubelet_host::HostGuard;
use ringlet_tests::kubelet_host::{KUBELET_ENV, LabKubelet};

use crate::benchkit::{Agent, free_port};
use crate::{cluster, cmd, lab};

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
/// `root_dir`; with `evented_pleg`, its `EventedPLEG` feature gate on.
pub fn spawn_standalone(
    kubelet: &Path,
    node: &str,
    run_dir: &Path,
    root_dir: &Path,
    manifests: &Path,
    read_only_port: u16,
    evented_pleg: bool,
) -> Result<Agent> {
    let standalone = LabKubelet {
        manifests: manifests.to_path_buf(),
        run_dir: run_dir.to_path_buf(),
        root_dir: root_dir.to_path_buf(),
        read_only_port,
        port: free_port()?,
        healthz_port: free_port()?,
        registration: None,
        evented_pleg,
    };
    Agent::spawn(
        &mut standalone.command(kubelet, node)?,
        run_dir.join("kubelet.log"),
    )
}
