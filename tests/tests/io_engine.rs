//! End-to-end: the I/O engine choice. With `io_uring` switched off by the kernel
//! (`kernel.io_uring_disabled=2`), `--io-engine=auto` falls back to epoll, says why in one log line
//! and keeps working, while `--io-engine=uring` refuses to start. Run as root after
//! `cargo xtask lab up`, one test at a time (the sysctl is machine-wide; it is restored afterwards,
//! also when the test fails).

use std::fs;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use ringlet_tests::{
    Agent, AgentOptions, busybox_pod, container_status, http_get, phase, require_lab,
    ringlet_binary, wait_for,
};

const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// Sets the sysctl for the test and puts the old value back when dropped.
struct SysctlGuard {
    old: String,
}

impl SysctlGuard {
    fn set(value: &str) -> Result<Self> {
        let old = fs::read_to_string(IO_URING_DISABLED)
            .with_context(|| format!("reading {IO_URING_DISABLED}"))?;
        fs::write(IO_URING_DISABLED, value)
            .with_context(|| format!("writing {value} to {IO_URING_DISABLED}"))?;
        Ok(Self { old })
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        let _ = fs::write(IO_URING_DISABLED, self.old.trim());
    }
}

#[test]
fn auto_falls_back_to_epoll_when_the_kernel_disables_io_uring() -> Result<()> {
    if !require_lab("auto_falls_back_to_epoll_when_the_kernel_disables_io_uring") {
        return Ok(());
    }
    let disabled = SysctlGuard::set("2")?;
    let agent = Agent::start(
        "io-fallback",
        AgentOptions {
            args: vec!["--io-engine=auto".to_owned()],
            ..AgentOptions::default()
        },
    )?;
    let log = agent.log();
    let fallback: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("io_uring unavailable, running the epoll engine"))
        .collect();
    assert_eq!(fallback.len(), 1, "one fallback line expected:\n{log}");
    assert!(fallback[0].contains("io_uring_disabled"), "{}", fallback[0]);
    // Healthy once the first relist and sync-loop round are done, which may follow the port.
    let health = wait_for("a healthy agent", Duration::from_secs(30), || {
        http_get(agent.healthz_port, "/healthz?verbose")
            .ok()
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
    })?;
    assert!(health.contains("info: ping: io engine epoll"), "{health}");
    assert_eq!(agent.metric("ringlet_io_engine{engine=\"epoll\"}")?, 1);

    // The agent works: a pod runs and shows on the kubelet API.
    agent.write_manifest("web.yaml", &busybox_pod("web", "Always", "exec sleep 3600"))?;
    agent.wait_pod("web", "running", Duration::from_mins(1), |pod| {
        phase(pod) == "Running"
            && container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
    })?;
    assert_eq!(agent.api_get("/pods")?.0, 200);

    // Forcing io_uring while it is disabled is an error naming the cause, not a silent fallback.
    let root = tempfile::tempdir()?;
    let forced = Command::new(ringlet_binary()?)
        .args(["--io-engine=uring", "--hostname-override", "io-forced"])
        .arg("--root-dir")
        .arg(root.path())
        .output()?;
    assert!(!forced.status.success());
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(
        stderr.contains("io engine uring was requested but cannot be used")
            && stderr.contains("io_uring_disabled"),
        "{stderr}"
    );
    drop(disabled);
    Ok(())
}
