//! `ringlet-hollow` (package `ringlet-hollow`, a scale harness, not a container runtime) as the
//! scale bench runs it: started on a socket of its own under a run directory, the processes of its
//! containers found by container id, and the pod cgroups an agent leaves behind removed.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::benchkit::Agent;

const START_TIMEOUT: Duration = Duration::from_secs(30);
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Where both agents put pod cgroups (cgroupfs driver), below every hierarchy.
const KUBEPODS: &str = "kubepods";

/// A running `ringlet-hollow`, stopped (SIGTERM: it kills its containers and removes their
/// cgroups) however the run ends.
pub struct Hollow {
    process: Agent,
    socket: PathBuf,
}

impl Hollow {
    /// Starts `binary` (with `ringlet-hollow-child` next to it) serving on `<run_dir>/hollow.sock`,
    /// in a process group of its own, and waits until the socket accepts connections.
    pub fn start(binary: &Path, run_dir: &Path) -> Result<Self> {
        let socket = run_dir.join("hollow.sock");
        let mut process = Agent::spawn(
            Command::new(binary)
                .arg("--listen")
                .arg(&socket)
                .arg("--root")
                .arg(run_dir.join("hollow-root"))
                .args(["--log", "warn"])
                .process_group(0),
            run_dir.join("hollow.log"),
        )?;
        let started = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            process.exited()?;
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "ringlet-hollow did not listen on {} within {START_TIMEOUT:?}",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { process, socket })
    }

    /// The agents' `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn exited(&mut self) -> Result<()> {
        self.process.exited()
    }

    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Container id → pid of every container process: the runtime's children, each in a cgroup
    /// named after its container (the last component of its cgroup path, as runc names it).
    pub fn container_pids(&self) -> Result<HashMap<String, u32>> {
        let pid = self.process.pid();
        let mut pids = HashMap::new();
        for task in fs::read_dir(format!("/proc/{pid}/task"))? {
            let children = fs::read_to_string(task?.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if let Some(id) = container_of(child) {
                    pids.insert(id, child);
                }
            }
        }
        Ok(pids)
    }
}

/// The container id of process `pid`: the last component of its cgroup path in the first
/// hierarchy listed.
fn container_of(pid: u32) -> Option<String> {
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().next()?.rsplit(':').next()?;
    let id = path.rsplit('/').next()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// The cgroups below `kubepods` in every hierarchy before a run, so that the ones the run made
/// (pods the agent had no time to remove) can go afterwards and the others stay.
pub struct PodCgroups {
    before: HashSet<PathBuf>,
}

impl PodCgroups {
    pub fn snapshot() -> Result<Self> {
        Ok(Self {
            before: kubepods_cgroups()?.into_iter().collect(),
        })
    }

    /// Removes every cgroup below `kubepods` that was not there before, deepest first; returns
    /// how many there were. A cgroup that still has processes cannot go and is an error.
    pub fn remove_new(&self) -> Result<usize> {
        let mut new: Vec<PathBuf> = kubepods_cgroups()?
            .into_iter()
            .filter(|c| !self.before.contains(c))
            .collect();
        new.sort_by_key(|c| std::cmp::Reverse(c.components().count()));
        let mut failed = Vec::new();
        for cgroup in &new {
            if let Err(e) = fs::remove_dir(cgroup)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                failed.push(format!("{}: {e}", cgroup.display()));
            }
        }
        if let Some(first) = failed.first() {
            bail!(
                "{} of {} pod cgroups left by the run could not be removed, e.g. {first}",
                failed.len(),
                new.len()
            );
        }
        Ok(new.len())
    }
}

/// Every directory below `<hierarchy>/kubepods`, in every mounted hierarchy.
fn kubepods_cgroups() -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for hierarchy in fs::read_dir(CGROUP_ROOT).with_context(|| format!("listing {CGROUP_ROOT}"))? {
        let kubepods = hierarchy?.path().join(KUBEPODS);
        if kubepods.is_dir() {
            below(&kubepods, &mut found)?;
        }
    }
    Ok(found)
}

fn below(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            let path = entry.path();
            below(&path, found)?;
            found.push(path);
        }
    }
    Ok(())
}
