//! The demo's exit chain: once the example `web` pod runs, SIGKILLs its container's init and prints,
//! from `ringlet events`, how that one exit travelled through the agent (kernel exit → PLEG event →
//! pod status → runtime's own report), then streams every event until Ctrl-C.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{benchkit, cmd, http};

/// The example pod whose container the demo kills (restartPolicy Always: it comes back).
const POD: &str = "web-ringlet-demo";
const CONTAINER: &str = "httpd";
/// Upper bound for the pod to run after the agent starts (image import, sandbox, start).
const START: Duration = Duration::from_mins(2);
/// Upper bound for the chain of one exit to complete (containerd's report comes last, ~0.1 s).
const CHAIN: Duration = Duration::from_secs(10);

/// Runs the exit chain against the agent serving `/pods` on `read_only_port`, then streams events
/// (text) until the process group gets Ctrl-C.
pub fn show(ringlet: &Path, read_only_port: u16, events_socket: &Path) -> Result<()> {
    let container_id = wait_running(read_only_port)?;
    let mut watcher = Command::new(ringlet)
        .args(["events", "--output", "json", "--pod", POD, "--socket"])
        .arg(events_socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ringlet events")?;
    let result = ringlet_tests::wait_until_watching(&mut watcher, CHAIN)
        .and_then(|()| kill_and_trace(&mut watcher, &container_id));
    let _ = watcher.kill();
    let _ = watcher.wait();
    result?;
    println!("\nevery lifecycle event from here on (Ctrl-C stops the demo):");
    let status = Command::new(ringlet)
        .args(["events", "--socket"])
        .arg(events_socket)
        .status()
        .context("running ringlet events")?;
    println!("ringlet events exited: {status}");
    Ok(())
}

/// Waits until `/pods` shows the demo container running; returns its containerd id.
fn wait_running(read_only_port: u16) -> Result<String> {
    let deadline = Instant::now() + START;
    loop {
        if let Some(id) = running_container(read_only_port) {
            return Ok(id);
        }
        if Instant::now() > deadline {
            bail!("{POD}/{CONTAINER} did not run within {START:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn running_container(read_only_port: u16) -> Option<String> {
    let pods: Value = serde_json::from_slice(&http::get(read_only_port, "/pods").ok()?).ok()?;
    let pod = pods["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == POD)?;
    let status = pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == CONTAINER)?;
    status["state"]["running"].as_object()?;
    let id = status["containerID"].as_str()?;
    Some(id.trim_start_matches("containerd://").to_owned())
}

/// The stages of one exit, as `ringlet events` names them, in the order they happen.
const STAGES: [(&str, &str); 3] = [
    ("ContainerDied", "PLEG event (ContainerDied)"),
    ("StatusUpdated", "pod status shows it"),
    ("RuntimeConfirmed", "containerd reports it"),
];

fn kill_and_trace(watcher: &mut Child, container_id: &str) -> Result<()> {
    let pid = *benchkit::task_pids()?
        .get(container_id)
        .with_context(|| format!("containerd runs no task for container {container_id}"))?;
    let stdout = watcher
        .stdout
        .take()
        .context("ringlet events has no stdout")?;
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    println!("\nkilling {POD}/{CONTAINER} (SIGKILL of its init, pid {pid}) ...");
    cmd::run(Command::new("kill").args(["-KILL", &pid.to_string()]))?;

    let deadline = Instant::now() + CHAIN;
    let mut seen: Vec<Option<u64>> = vec![None; STAGES.len()];
    while seen.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = received.recv_timeout(left) else {
            break;
        };
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let kind = event["kind"].as_str().unwrap_or_default();
        if let Some(stage) = STAGES.iter().position(|(name, _)| *name == kind)
            && seen[stage].is_none()
        {
            seen[stage] = Some(event["kernel_to_event_ns"].as_u64().unwrap_or_default());
        }
    }
    println!("the exit's chain, from the kernel's timestamp of the exit:");
    println!("  {:<28} {:>12}", "kernel: init exited", "0");
    for ((_, label), at) in STAGES.iter().zip(&seen) {
        let shown = match at {
            Some(0) => "no kernel time (relist mode)".to_owned(),
            Some(ns) => format_ns(*ns),
            None => format!("not seen within {CHAIN:?}"),
        };
        println!("  {label:<28} {shown:>12}");
    }
    Ok(())
}

fn format_ns(ns: u64) -> String {
    let micros = ns / 1_000;
    if micros < 1_000 {
        format!("+{micros} µs")
    } else {
        #[allow(clippy::cast_precision_loss)] // a display value, far below 2^52 µs
        let millis = micros as f64 / 1_000.0;
        format!("+{millis:.2} ms")
    }
}
