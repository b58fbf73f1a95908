//! Against the host's real cgroup v1 controllers: a CPU-burning process in a cgroup of its own.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The test cgroup in the cpuacct and memory hierarchies; kills the process and removes the
/// directories when dropped, also when an assertion fails.
struct TestCgroup {
    dirs: Vec<PathBuf>,
    child: Option<Child>,
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in &self.dirs {
            // The kernel lets go of a dead task's cgroup asynchronously: retry briefly.
            for _ in 0..100 {
                match fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    _ => break,
                }
            }
        }
    }
}

fn skip_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".to_owned());
    }
    match CgroupLayout::detect() {
        Ok(CgroupLayout::V1 { .. }) => None,
        Ok(layout) => Some(format!("no cgroup v1 memory controller ({layout:?})")),
        Err(e) => Some(format!("no cgroup hierarchy: {e}")),
    }
}

#[test]
fn real_cgroup_cpu_grows_and_memory_is_counted() {
    if let Some(reason) = skip_reason() {
        crate::testing::skip("real_cgroup_cpu_grows_and_memory_is_counted", &reason);
        return;
    }
    let layout = CgroupLayout::detect().unwrap();
    let CgroupLayout::V1 { cpuacct, memory } = &layout else {
        unreachable!("checked by skip_reason");
    };
    let name = format!("ringlet-stats-test-{}", std::process::id());
    let mut guard = TestCgroup {
        dirs: Vec::new(),
        child: None,
    };
    for mount in [cpuacct, memory] {
        let dir = mount.join(&name);
        fs::create_dir(&dir).unwrap();
        guard.dirs.push(dir);
    }
    // The shell moves itself in before exec, so the burner's pages are charged to the new cgroup.
    let procs: Vec<String> = guard
        .dirs
        .iter()
        .map(|dir| format!("echo $$ > {}/cgroup.procs", dir.display()))
        .collect();
    let script = format!(
        "{} && exec sh -c 'x=0; while :; do x=$((x+1)); done'",
        procs.join(" && ")
    );
    guard.child = Some(
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The lab has no /var/lib/kubelet; the root filesystem stands in for it.
    let settings = StatsSettings {
        pods_cgroup: None,
        root_dir: PathBuf::from("/"),
        ..StatsSettings::new("node-a", layout.clone())
    };
    let provider = StatsProvider::new(settings);
    let pods = [PodStatsInput {
        cgroup: format!("/{name}"),
        ..pod_input(Vec::new())
    }];

    let deadline = Instant::now() + Duration::from_secs(10);
    let first_usage = loop {
        let summary = provider.summary(&pods);
        let usage = summary.pods[0]
            .cpu
            .as_ref()
            .and_then(|cpu| cpu.usage_core_nano_seconds)
            .unwrap_or(0);
        if usage > 0 || Instant::now() > deadline {
            break usage;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(first_usage > 0, "the burner never ran in the cgroup");

    let (cpu, memory) = loop {
        std::thread::sleep(Duration::from_millis(50));
        let summary = provider.summary(&pods);
        let pod = summary.pods[0].clone();
        let cpu = pod.cpu.unwrap();
        if cpu.usage_core_nano_seconds.unwrap() > first_usage || Instant::now() > deadline {
            break (cpu, pod.memory.unwrap());
        }
    };
    assert!(cpu.usage_core_nano_seconds.unwrap() > first_usage);
    assert!(cpu.usage_nano_cores.unwrap() > 0);
    assert!(memory.usage_bytes.unwrap() > 0);
    assert!(memory.working_set_bytes.unwrap() > 0);

    let node = provider.summary(&[]).node;
    assert!(node.cpu.unwrap().usage_core_nano_seconds.unwrap() > 0);
    assert!(node.memory.unwrap().working_set_bytes.unwrap() > 0);
    assert!(node.fs.unwrap().capacity_bytes.unwrap() > 0);
    assert!(node.rlimit.unwrap().curproc.unwrap() > 0);
}
