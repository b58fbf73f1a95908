//! End-to-end: what the node enforces on pods, read back from the real cgroup v1 files and
//! `/proc` of the lab's containerd: `podPidsLimit` as the pod cgroup's `pids.max`, `cpuCFSQuota:
//! false` as no CFS quota on a container with a CPU limit, `seccompDefault` as a seccomp filter on
//! a container that names no profile (and none on one that asks for `Unconfined`), and node
//! allocatable (`kubeReserved`) as the `kubepods` cgroup's memory and process limits. Run as root
//! after `cargo xtask lab up`, one test at a time.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use ringlet_tests::{Agent, AgentOptions, container_status, require_lab, tail, task, wait_for};
use serde_json::Value;

/// Upper bound for the pod to start on this machine (image present).
const START: Duration = Duration::from_secs(30);
const KUBE_RESERVED_MEMORY: u64 = 64 << 20;
const KUBE_RESERVED_PIDS: u64 = 1000;

fn read(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .to_owned())
}

fn number(path: &Path) -> Result<u64> {
    read(path)?
        .parse()
        .with_context(|| format!("{} is not a number", path.display()))
}

/// The `Seccomp:` mode of the container's process (0 off, 2 filter).
fn seccomp_mode(pod: &Value, container: &str) -> Result<String> {
    let id = container_id(pod, container)?;
    let (pid, _) = task(&id)?.with_context(|| format!("container {container} has no task"))?;
    let status = read(&Path::new("/proc").join(pid.to_string()).join("status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Seccomp:"))
        .map(|mode| mode.trim().to_owned())
        .context("no Seccomp line in /proc/<pid>/status")
}

fn container_id(pod: &Value, container: &str) -> Result<String> {
    container_status(pod, container)
        .and_then(|c| c["containerID"].as_str())
        .and_then(|id| id.strip_prefix("containerd://"))
        .map(str::to_owned)
        .with_context(|| format!("container {container} has no id"))
}

/// The smaller of the kernel's two task limits: the node's process capacity.
fn task_capacity() -> Result<u64> {
    Ok(number(Path::new("/proc/sys/kernel/pid_max"))?
        .min(number(Path::new("/proc/sys/kernel/threads-max"))?))
}

fn mem_total() -> Result<u64> {
    let meminfo = read(Path::new("/proc/meminfo"))?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .context("no MemTotal in /proc/meminfo")?;
    Ok(kib * 1024)
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: limits
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: limited
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    resources:
      limits: {cpu: 500m}
  - name: unconfined
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    securityContext:
      seccompProfile: {type: Unconfined}
"#;

#[test]
fn pids_cfs_quota_seccomp_and_node_allocatable_reach_the_host() -> Result<()> {
    if !require_lab("pids_cfs_quota_seccomp_and_node_allocatable_reach_the_host") {
        return Ok(());
    }
    let config = tempfile::NamedTempFile::new()?;
    std::fs::write(
        config.path(),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             kubeReserved: {{memory: \"{KUBE_RESERVED_MEMORY}\", pid: \"{KUBE_RESERVED_PIDS}\"}}\n"
        ),
    )?;
    let agent = Agent::start(
        "node_allocatable",
        AgentOptions {
            args: [
                "--config",
                &config.path().display().to_string(),
                "--pod-max-pids=64",
                "--cpu-cfs-quota=false",
                "--seccomp-default",
            ]
            .map(str::to_owned)
            .to_vec(),
            ..AgentOptions::default()
        },
    )?;
    agent.write_manifest("limits.yaml", MANIFEST)?;
    let pod = agent.wait_pod("limits", "both containers running", START, |pod| {
        ["limited", "unconfined"]
            .iter()
            .all(|c| container_status(pod, c).is_some_and(|s| s["state"]["running"].is_object()))
    })?;
    let uid = pod["metadata"]["uid"].as_str().context("no uid")?;

    // A CPU limit without requests: Burstable.
    let pod_cgroup = format!("kubepods/burstable/pod{uid}");
    let pids_max = Path::new("/sys/fs/cgroup/pids")
        .join(&pod_cgroup)
        .join("pids.max");
    ensure!(read(&pids_max)? == "64", "{} is not 64", pids_max.display());

    let quota = Path::new("/sys/fs/cgroup/cpu")
        .join(&pod_cgroup)
        .join(container_id(&pod, "limited")?)
        .join("cpu.cfs_quota_us");
    ensure!(
        read(&quota)? == "-1",
        "{} is {} with cpuCFSQuota off",
        quota.display(),
        read(&quota)?
    );

    ensure!(
        seccomp_mode(&pod, "limited")? == "2",
        "a container without a profile is not filtered under seccompDefault"
    );
    ensure!(
        seccomp_mode(&pod, "unconfined")? == "0",
        "an Unconfined container is filtered"
    );

    // The pods' cgroup is limited in the background once the agent is up.
    let kubepods = Path::new("/sys/fs/cgroup");
    // The kernel keeps a memory limit in whole pages.
    let page = 4096;
    let expected = (
        (mem_total()? - KUBE_RESERVED_MEMORY) / page * page,
        task_capacity()? - KUBE_RESERVED_PIDS,
    );
    let found = wait_for("kubepods limited to node allocatable", START, || {
        let memory = number(&kubepods.join("memory/kubepods/memory.limit_in_bytes")).ok()?;
        let pids = number(&kubepods.join("pids/kubepods/pids.max")).ok()?;
        ((memory, pids) == expected).then_some((memory, pids))
    })
    .with_context(|| {
        format!(
            "expected memory and pids limits {expected:?}; agent log:\n{}",
            tail(&agent.log(), 40)
        )
    })?;
    ensure!(found == expected);
    Ok(())
}
