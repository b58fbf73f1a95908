//! End-to-end: the eBPF PLEG on the real kernel and the lab's containerd. Container starts, exits
//! and OOM kills reach `/pods` through kernel hints and targeted relists while the safety relist is
//! ten minutes away; lost kernel events (a one-page ring buffer) turn into a full relist; the agent
//! falls back to the relist PLEG, saying why, when the programs cannot load; the pins exist while it
//! runs and go on SIGTERM; `ringlet events` streams the deaths. The exit of a container's init is
//! published from the kernel, and only that: a process exec'd into the container never counts,
//! also after an agent restart, and a restart after such an exit creates one container.
//!
//! Run as root after `cargo xtask lab up`, one test at a time (`--test-threads=1`): the pins under
//! `/sys/fs/bpf/ringlet` are one per machine.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ringlet_tests::{
    Agent, AgentOptions, busybox_pod, container_status, http_get, memory_hog_pod, phase,
    require_ebpf_lab, ringlet_binary, tail, wait_for, wait_until_watching,
};
use serde_json::Value;

/// Upper bound for a pod to start on this machine (image present, sandbox ~0.1 s, containers ~0.1 s).
const START: Duration = Duration::from_mins(1);
/// The safety relist period of these tests: nothing they wait for may come from it.
const SAFETY_PERIOD: &str = "10m";
/// Upper bound for a kernel-reported change to reach `/pods` through a hint: a targeted relist, a
/// pod sync and a status update, on a shared 2-core machine. Far below [`SAFETY_PERIOD`].
const HINTED: Duration = Duration::from_secs(8);
/// The pin directory of the eBPF PLEG.
const PIN_DIR: &str = "/sys/fs/bpf/ringlet";
const MAPS: [&str; 4] = [
    "ringlet_events",
    "ringlet_drops",
    "ringlet_pods_cg",
    "ringlet_started",
];
const PROGRAMS: [&str; 5] = [
    "ringlet_mkdir",
    "ringlet_rmdir",
    "ringlet_exec",
    "ringlet_exit",
    "ringlet_oom",
];
/// Pods the overflow test runs.
const BURST_PODS: usize = 20;
const FULL: &str = r#"ringlet_pleg_relists_total{type="full"}"#;
const AWAITING: &str = "ringlet_pleg_pods_awaiting_runtime";
/// Pods the start test runs at once.
const STARTED_PODS: usize = 6;
const TARGETED: &str = r#"ringlet_pleg_relists_total{type="targeted"}"#;

fn ebpf_agent(test: &str, extra: &[&str]) -> Result<Agent> {
    let mut args = vec![
        "--pleg-mode=ebpf".to_owned(),
        format!("--pleg-relist-period={SAFETY_PERIOD}"),
    ];
    args.extend(extra.iter().map(|&a| a.to_owned()));
    let agent = Agent::start(
        test,
        AgentOptions {
            args,
            ..AgentOptions::default()
        },
    )?;
    let mode = agent.metric(r#"ringlet_pleg_mode{mode="ebpf"}"#)?;
    ensure!(
        mode == 1,
        "the agent did not start in ebpf mode; log:\n{}",
        tail(&agent.log(), 40)
    );
    Ok(agent)
}

/// The agent's log lines about the PLEG and pod `name` (other agents' orphans make the rest noisy).
fn pleg_log(agent: &Agent, name: &str) -> String {
    let full = format!("{name}-{}", agent.node);
    let lines: Vec<String> = agent
        .log()
        .lines()
        .filter(|l| l.contains("pleg") || l.contains("relist") || l.contains(&full))
        .map(str::to_owned)
        .collect();
    tail(&lines.join("\n"), 80)
}

/// What the PLEG's log says about the full relists requested in `window` (a stretch of the agent's
/// log): how many hints about other pods (other agents' on this machine) or resyncs asked for one.
/// Fails when a hint about `our_uid` did, since then `our_uid` was not known to the PLEG.
fn relist_requests(window: &str, our_uid: &str) -> Result<usize> {
    let mut requests = 0;
    for line in window.lines() {
        if line.contains("hint for a pod the pleg does not know") {
            ensure!(
                !line.contains(our_uid),
                "the PLEG did not know the pod: {line}"
            );
            requests += 1;
        } else if line.contains("hint source asked for a full relist") {
            requests += 1;
        }
    }
    Ok(requests)
}

/// Checks that the full relists between two snapshots were all asked for by hints about other pods
/// (or none at all on a quiet machine): none was the safety relist, none was needed for our pod.
fn assert_no_safety_relist(full_delta: u64, window: &str, our_uid: &str) -> Result<()> {
    let requests = u64::try_from(relist_requests(window, our_uid)?)?;
    if requests == 0 {
        ensure!(
            full_delta == 0,
            "{full_delta} full relists ran though nothing asked for one"
        );
    } else {
        // One more for a request logged just before the window whose relist ran inside it.
        ensure!(
            full_delta <= requests + 1,
            "{full_delta} full relists ran, only {requests} were asked for by other pods' hints"
        );
        eprintln!(
            "note: {requests} full relists were asked for by other pods' hints (another agent runs here)"
        );
    }
    Ok(())
}

/// The agent's `ringlet_pleg_*` counters, for failure messages.
fn pleg_metrics(agent: &Agent) -> String {
    agent
        .metrics()
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("ringlet_pleg_hints")
                || l.starts_with("ringlet_pleg_relists")
                || l.starts_with("ringlet_ebpf")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn running(pod: &Value, container: &str) -> bool {
    container_status(pod, container).is_some_and(|c| c["state"]["running"].is_object())
}

fn terminated<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    container_status(pod, container)
        .map(|c| &c["state"]["terminated"])
        .filter(|t| t.is_object())
}

fn init_status<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    pod["status"]["initContainerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)
}

#[test]
fn an_exit_reaches_pods_through_a_hint_not_a_safety_relist() -> Result<()> {
    if !require_ebpf_lab("an_exit_reaches_pods_through_a_hint_not_a_safety_relist") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-exit", &[])?;
    agent.write_manifest(
        "exit.yaml",
        &busybox_pod("exit", "Never", "sleep 3; exit 7"),
    )?;
    let pod = agent.wait_pod("exit", "running", START, |p| running(p, "main"))?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // A new pod is unknown to the PLEG, so its first cgroup's hint asks for a full relist; from here
    // on only hints about a known pod can tell the PLEG anything.
    let mark = agent.log().len();
    let full_before = agent.metric(FULL)?;
    let targeted_before = agent.metric(TARGETED)?;
    let seen_running = Instant::now();

    let pod = agent
        .wait_pod("exit", "terminated", HINTED, |p| {
            terminated(p, "main").is_some()
        })
        .with_context(|| pleg_log(&agent, "exit"))?;
    let waited = seen_running.elapsed();
    let main = terminated(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(main["exitCode"], 7, "{main}");
    assert_eq!(main["reason"], "Error", "{main}");
    assert_eq!(phase(&pod), "Failed");

    let metrics = agent.metrics()?;
    let full_after = ringlet_tests::metric_value::<u64>(&metrics, FULL).unwrap_or_default();
    let targeted_after = ringlet_tests::metric_value::<u64>(&metrics, TARGETED).unwrap_or_default();
    assert_no_safety_relist(
        full_after - full_before,
        agent.log().get(mark..).unwrap_or_default(),
        &uid,
    )
    .with_context(|| format!("between the start and the exit ({waited:?})"))?;
    // Only a pod the PLEG knows gets a targeted relist, and this agent knows only this one.
    assert!(
        targeted_after > targeted_before,
        "the exit must have been read by a targeted relist: {targeted_before} -> {targeted_after}"
    );
    assert!(
        ringlet_tests::metric_value::<u64>(&metrics, r#"ringlet_pleg_hints_total{kind="died"}"#)
            .unwrap_or_default()
            >= 1
    );
    Ok(())
}

#[test]
fn a_start_reaches_pods_through_a_hint_not_a_safety_relist() -> Result<()> {
    if !require_ebpf_lab("a_start_reaches_pods_through_a_hint_not_a_safety_relist") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-start", &[])?;
    // The init container's exit lets the main container start: both are news about a pod the PLEG
    // already knows, so only hints can bring them in before the safety relist.
    agent.write_manifest(
        "start.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: start
spec:
  hostNetwork: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: setup
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "sleep 3"]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#,
    )?;
    let pod = agent.wait_pod("start", "init container running", START, |p| {
        init_status(p, "setup").is_some_and(|c| c["state"]["running"].is_object())
    })?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mark = agent.log().len();
    let full_before = agent.metric(FULL)?;
    let targeted_before = agent.metric(TARGETED)?;
    let started_before = agent.metric(r#"ringlet_pleg_hints_total{kind="started"}"#)?;

    let pod = agent
        .wait_pod("start", "main running", HINTED, |p| running(p, "main"))
        .with_context(|| pleg_log(&agent, "start"))
        .with_context(|| pleg_metrics(&agent))
        .with_context(|| {
            let main = agent
                .pod("start")
                .and_then(|p| container_status(&p, "main").cloned());
            format!("main on /pods: {main:?}")
        })?;
    let setup = init_status(&pod, "setup").cloned().unwrap_or_default();
    assert_eq!(setup["state"]["terminated"]["exitCode"], 0, "{setup}");
    assert_eq!(phase(&pod), "Running");
    assert_no_safety_relist(
        agent.metric(FULL)? - full_before,
        agent.log().get(mark..).unwrap_or_default(),
        &uid,
    )
    .context("between the init container's start and main's")?;
    assert!(
        agent.metric(TARGETED)? > targeted_before,
        "main's start must have been read by a targeted relist"
    );
    assert!(
        agent.metric(r#"ringlet_pleg_hints_total{kind="started"}"#)? > started_before,
        "main's first exec must have been hinted"
    );
    Ok(())
}

#[test]
fn pods_start_without_a_full_relist() -> Result<()> {
    if !require_ebpf_lab("pods_start_without_a_full_relist") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-starts", &[])?;
    let mark = agent.log().len();
    let full_before = agent.metric(FULL)?;
    let names: Vec<String> = (0..STARTED_PODS).map(|i| format!("starts-{i}")).collect();
    for name in &names {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &busybox_pod(name, "Always", "sleep 3600"),
        )?;
    }
    let mut first_uid = String::new();
    for name in &names {
        let pod = agent.wait_pod(name, "running", START, |p| running(p, "main"))?;
        if first_uid.is_empty() {
            first_uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        }
    }
    // runc's own processes exit in each new sandbox's and container's cgroup around the start; the
    // runtime, which shows them running, is waited for only while their init may have been one.
    wait_for("no pod waiting for the runtime", HINTED, || {
        (agent.metric(AWAITING).ok()? == 0).then_some(())
    })
    .with_context(|| pleg_log(&agent, "starts"))?;
    assert_no_safety_relist(
        agent.metric(FULL)? - full_before,
        agent.log().get(mark..).unwrap_or_default(),
        &first_uid,
    )
    .with_context(|| pleg_metrics(&agent))
    .context("while the pods started")?;
    Ok(())
}

#[test]
fn an_oom_kill_is_reported_without_a_safety_relist() -> Result<()> {
    if !require_ebpf_lab("an_oom_kill_is_reported_without_a_safety_relist") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-oom", &[])?;
    let written = Instant::now();
    agent.write_manifest("hog.yaml", &memory_hog_pod("hog"))?;
    // The manifest poll (2 s), the start and the allocation, then the hinted exit: seconds, where a
    // safety relist would take ten minutes.
    let pod = agent.wait_pod("hog", "Failed", Duration::from_secs(30), |p| {
        phase(p) == "Failed"
    })?;
    let main = terminated(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(
        main["reason"],
        "OOMKilled",
        "{main} after {:?}",
        written.elapsed()
    );
    assert_eq!(main["exitCode"], 137, "{main}");
    assert!(
        agent.metric(r#"ringlet_pleg_hints_total{kind="oom_killed"}"#)? >= 1,
        "the kernel's OOM victim must have been hinted"
    );
    assert!(agent.metric(TARGETED)? >= 1);
    Ok(())
}

/// Cgroup directories made below the pods' parent to flood the ring buffer; removed on drop.
struct CgroupBurst {
    root: PathBuf,
}

impl CgroupBurst {
    fn new() -> Result<Self> {
        let root = PathBuf::from(format!(
            "/sys/fs/cgroup/unified/kubepods/e2e-burst-{}",
            std::process::id()
        ));
        fs::create_dir(&root).with_context(|| format!("creating {}", root.display()))?;
        Ok(Self { root })
    }

    /// Makes and removes `count` cgroups as fast as possible: two kernel events each.
    fn churn(&self, count: usize) -> Result<()> {
        for round in 0..count {
            let dir = self.root.join(format!("c{round}"));
            fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            fs::remove_dir(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(())
    }
}

impl Drop for CgroupBurst {
    fn drop(&mut self) {
        if let Ok(entries) = fs::read_dir(&self.root) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
        let _ = fs::remove_dir(&self.root);
    }
}

#[test]
fn lost_kernel_events_force_a_full_relist_and_no_pod_is_missed() -> Result<()> {
    if !require_ebpf_lab("lost_kernel_events_force_a_full_relist_and_no_pod_is_missed") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-overflow", &["--ebpf-ring-buffer-bytes=4096"])?;
    for i in 0..BURST_PODS {
        agent.write_manifest(
            &format!("job{i}.yaml"),
            &busybox_pod(&format!("job{i}"), "Never", "exit 0"),
        )?;
    }
    // A one-page ring buffer holds about 17 events; a thousand in a tight loop cannot all fit.
    let burst = CgroupBurst::new()?;
    wait_for("ring-buffer drops", Duration::from_secs(30), || {
        burst.churn(500).ok()?;
        let drops = agent.metric("ringlet_ebpf_ring_buffer_drops_total").ok()?;
        (drops > 0).then_some(())
    })?;
    drop(burst);

    for i in 0..BURST_PODS {
        agent.wait_pod(&format!("job{i}"), "Succeeded", START, |p| {
            phase(p) == "Succeeded" && terminated(p, "main").is_some_and(|t| t["exitCode"] == 0)
        })?;
    }
    let metrics = agent.metrics()?;
    let value =
        |series: &str| ringlet_tests::metric_value::<u64>(&metrics, series).unwrap_or_default();
    assert!(value("ringlet_ebpf_ring_buffer_drops_total") > 0);
    assert!(
        value(r#"ringlet_pleg_hints_total{kind="resync"}"#) > 0,
        "lost events must ask for a resync; log:\n{}",
        tail(&agent.log(), 40)
    );
    assert!(value(FULL) > 1, "full relists: {}", value(FULL));
    assert!(
        agent
            .log()
            .contains("the BPF ring buffer was full: events lost, relisting everything"),
        "the agent must say why it relists"
    );
    Ok(())
}

#[test]
fn without_bpffs_the_agent_says_why_and_runs_the_relist_pleg() -> Result<()> {
    if !require_ebpf_lab("without_bpffs_the_agent_says_why_and_runs_the_relist_pleg") {
        return Ok(());
    }
    // The agent gets a mount namespace of its own where /sys/fs/bpf is a tmpfs: the pins cannot be
    // made, so the programs are not loaded. The host's mounts stay as they are (private propagation).
    let without_bpffs = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount -t tmpfs e2e-no-bpffs /sys/fs/bpf && exec "$0" "$@""#,
    ];
    // Asked for explicitly, the eBPF PLEG is not quietly replaced: the agent does not start.
    let dir = tempfile::tempdir()?;
    let refused = Command::new(without_bpffs[0])
        .args(&without_bpffs[1..])
        .arg(ringlet_binary()?)
        .args([
            "--pleg-mode=ebpf",
            "--hostname-override",
            "e2e-ebpf-refused",
            "--root-dir",
            &dir.path().join("root").display().to_string(),
            "--events-socket",
            &dir.path().join("events.sock").display().to_string(),
            "--read-only-port=0",
            "--healthz-port=0",
            "--enable-server=false",
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success(),
        "--pleg-mode=ebpf must not fall back: {stderr}"
    );
    ensure!(
        stderr.contains("--pleg-mode=ebpf: the eBPF PLEG cannot start")
            && stderr.contains("/sys/fs/bpf is not on a bpf filesystem"),
        "{stderr}"
    );
    // ... and says which modes would run without it.
    ensure!(
        stderr.contains("--pleg-mode=auto would fall back to the relist PLEG")
            && stderr.contains("--pleg-mode=relist does not use eBPF"),
        "the error must name the modes that fall back: {stderr}"
    );
    let agent = Agent::start_wrapped(
        "ebpf-fallback",
        AgentOptions {
            args: vec![
                "--pleg-mode=auto".to_owned(),
                "--pleg-relist-period=1s".to_owned(),
            ],
            ..AgentOptions::default()
        },
        &without_bpffs,
    )?;
    assert_eq!(agent.metric(r#"ringlet_pleg_mode{mode="relist"}"#)?, 1);
    assert_eq!(agent.metric(r#"ringlet_pleg_mode{mode="ebpf"}"#)?, 0);
    let log = agent.log();
    let reason = log
        .lines()
        .find(|l| l.contains("eBPF PLEG unavailable, running the relist PLEG: "))
        .with_context(|| format!("no fallback line in the log:\n{}", tail(&log, 40)))?;
    assert!(
        reason.contains("/sys/fs/bpf is not on a bpf filesystem"),
        "the reason must name the missing bpffs: {reason}"
    );
    assert!(!Path::new(PIN_DIR).exists(), "a relist agent pins nothing");
    let (_, healthz) = http_get(agent.healthz_port, "/healthz?verbose")?;
    assert!(healthz.contains("info: pleg: mode relist"), "{healthz}");

    agent.write_manifest(
        "exit.yaml",
        &busybox_pod("exit", "Never", "sleep 1; exit 3"),
    )?;
    let pod = agent.wait_pod("exit", "terminated", START, |p| {
        terminated(p, "main").is_some()
    })?;
    assert_eq!(terminated(&pod, "main").unwrap()["exitCode"], 3);
    assert!(
        agent.metric(FULL)? > 1,
        "the relist PLEG relists every second"
    );
    assert_eq!(agent.metric(TARGETED)?, 0);
    Ok(())
}

#[test]
fn a_second_agent_leaves_the_first_ones_pins_alone() -> Result<()> {
    if !require_ebpf_lab("a_second_agent_leaves_the_first_ones_pins_alone") {
        return Ok(());
    }
    let first = ebpf_agent("ebpf-first", &[])?;
    let pins = || -> Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(PIN_DIR)?
            .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort();
        Ok(names)
    };
    let before = pins()?;
    ensure!(
        !before.is_empty(),
        "the first agent pins its maps and links"
    );
    let second = Agent::start(
        "ebpf-second",
        AgentOptions {
            args: vec!["--pleg-mode=auto".to_owned()],
            ..AgentOptions::default()
        },
    )?;
    assert_eq!(second.metric(r#"ringlet_pleg_mode{mode="relist"}"#)?, 1);
    let log = second.log();
    ensure!(
        log.contains("is in use by another ringlet (pid "),
        "the fallback names the holder:\n{}",
        tail(&log, 20)
    );
    assert_eq!(pins()?, before, "the first agent's pins are untouched");
    assert_eq!(first.metric(r#"ringlet_pleg_mode{mode="ebpf"}"#)?, 1);
    drop(second);
    assert_eq!(pins()?, before, "and stay when the second agent stops");
    Ok(())
}

#[test]
fn relist_mode_loads_no_programs() -> Result<()> {
    if !require_ebpf_lab("relist_mode_loads_no_programs") {
        return Ok(());
    }
    let agent = Agent::start(
        "ebpf-relist",
        AgentOptions {
            args: vec!["--pleg-mode=relist".to_owned()],
            ..AgentOptions::default()
        },
    )?;
    assert_eq!(agent.metric(r#"ringlet_pleg_mode{mode="relist"}"#)?, 1);
    assert!(!Path::new(PIN_DIR).exists(), "a relist agent pins nothing");
    assert!(
        !agent.log().contains("eBPF PLEG unavailable"),
        "relist mode is chosen, not a fallback"
    );
    agent.write_manifest("app.yaml", &busybox_pod("app", "Never", "exec sleep 3600"))?;
    agent.wait_pod("app", "running", START, |p| running(p, "main"))?;
    Ok(())
}

fn bpftool(args: &[&str]) -> Result<String> {
    let out = Command::new("bpftool")
        .args(args)
        .output()
        .context("cannot run bpftool (install the lab's bpftool package)")?;
    ensure!(
        out.status.success(),
        "bpftool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_pins_exist_while_the_agent_runs_and_go_on_sigterm() -> Result<()> {
    if !require_ebpf_lab("the_pins_exist_while_the_agent_runs_and_go_on_sigterm") {
        return Ok(());
    }
    let mut agent = ebpf_agent("ebpf-pins", &[])?;
    for name in MAPS.iter().chain(&PROGRAMS) {
        let pin = Path::new(PIN_DIR).join(name);
        assert!(pin.exists(), "{} is missing", pin.display());
    }
    let drops = bpftool(&[
        "-j",
        "map",
        "dump",
        "pinned",
        &format!("{PIN_DIR}/ringlet_drops"),
    ])?;
    let drops: Value = serde_json::from_str(&drops)?;
    assert!(
        drops.as_array().is_some_and(|entries| !entries.is_empty()),
        "{drops}"
    );
    let prog: Value =
        serde_json::from_str(&bpftool(&["-j", "prog", "show", "name", "ringlet_exit"])?)?;
    let progs: Vec<Value> = match prog {
        Value::Array(items) => items,
        one => vec![one],
    };
    assert!(
        progs
            .iter()
            .any(|p| p["name"] == "ringlet_exit" && p["type"] == "tracing"),
        "{progs:?}"
    );
    let (_, healthz) = http_get(agent.healthz_port, "/healthz?verbose")?;
    assert!(healthz.contains("info: pleg: mode ebpf"), "{healthz}");

    assert!(agent.stop()?, "the agent must exit cleanly on SIGTERM");
    assert!(
        !Path::new(PIN_DIR).exists(),
        "{PIN_DIR} must be gone after SIGTERM; log:\n{}",
        tail(&agent.log(), 20)
    );
    let after = Command::new("bpftool")
        .args(["-j", "prog", "show", "name", "ringlet_exit"])
        .output()?;
    let left = String::from_utf8_lossy(&after.stdout);
    assert!(
        !after.status.success() || !left.contains("ringlet_exit"),
        "the program must be detached and unloaded: {left}"
    );
    Ok(())
}

/// `ringlet events` as a child process, started once it watches; its stdout lines arrive on a
/// channel. Killed on drop.
struct EventsWatcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl EventsWatcher {
    fn start(socket: &Path) -> Result<Self> {
        let mut child = Command::new(ringlet_binary()?)
            .args(["events", "--socket"])
            .arg(socket)
            .args(["--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start ringlet events")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let mut watcher = Self { child, lines };
        wait_until_watching(&mut watcher.child, Duration::from_secs(30))?;
        Ok(watcher)
    }

    /// The first event accepted by `check`, within `timeout`; fails with every line seen.
    fn wait(&self, timeout: Duration, check: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let event: Value =
                        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?;
                    if check(&event) {
                        return Ok(event);
                    }
                    seen.push(line);
                }
                Err(_) => bail!(
                    "no matching event within {timeout:?}; saw:\n{}",
                    seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for EventsWatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn ringlet_events_streams_a_container_death_with_its_exit_code() -> Result<()> {
    if !require_ebpf_lab("ringlet_events_streams_a_container_death_with_its_exit_code") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-events", &[])?;
    let watcher = EventsWatcher::start(&agent.events_socket())?;
    let pod_name = format!("exit-{}", agent.node);
    agent.write_manifest(
        "exit.yaml",
        &busybox_pod("exit", "Never", "sleep 2; exit 5"),
    )?;
    let started = watcher.wait(START, |e| {
        e["kind"] == "ContainerStarted" && e["pod"] == pod_name.as_str() && e["container"] == "main"
    })?;
    assert_eq!(started["namespace"], "default");
    assert!(started["exit_code"].is_null(), "{started}");
    let died = watcher.wait(START, |e| {
        e["kind"] == "ContainerDied" && e["pod"] == pod_name.as_str() && e["container"] == "main"
    })?;
    assert_eq!(died["exit_code"], 5, "{died}");
    assert_eq!(died["namespace"], "default", "{died}");
    assert!(
        died["kernel_to_event_ns"].as_u64().is_some_and(|ns| ns > 0),
        "a hinted death carries its kernel → event latency: {died}"
    );
    let pod = agent.pod("exit").context("the pod left /pods")?;
    assert_eq!(
        died["pod_uid"], pod["metadata"]["uid"],
        "the event names the pod's uid"
    );
    Ok(())
}

/// The containerd id of the pod's container `container` on `/pods`.
fn container_id(pod: &Value, container: &str) -> Result<String> {
    let id = container_status(pod, container)
        .and_then(|c| c["containerID"].as_str())
        .context("the container has no id on /pods")?;
    Ok(id.trim_start_matches("containerd://").to_owned())
}

fn ctr() -> Command {
    let mut ctr = Command::new("ctr");
    ctr.args([
        "--address",
        ringlet_tests::CONTAINERD_SOCKET,
        "-n",
        "k8s.io",
    ]);
    ctr
}

/// The host pid of container `id`'s init, as containerd's task list shows it.
fn init_pid(id: &str) -> Result<u32> {
    let out = ctr().args(["tasks", "ls"]).output()?;
    ensure!(out.status.success(), "ctr tasks ls failed");
    let listing = String::from_utf8_lossy(&out.stdout);
    let line = listing
        .lines()
        .find(|l| l.starts_with(id))
        .with_context(|| format!("no task for container {id} in:\n{listing}"))?;
    line.split_whitespace()
        .nth(1)
        .context("no pid column")?
        .parse()
        .context("pid column is not a number")
}

/// A process started in container `id` the way `kubectl exec` starts one (a runc exec through
/// containerd): `sleep <seconds>`, with its host pid. The `ctr` client is killed with it.
struct ExecProcess {
    client: Child,
    pid: u32,
}

impl ExecProcess {
    fn start(id: &str, exec_id: &str, seconds: u32) -> Result<Self> {
        let client = ctr()
            .args(["tasks", "exec", "--exec-id", exec_id, id, "sleep"])
            .arg(seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pattern = format!("^sleep {seconds}$");
        let pid = wait_for("the exec'd process", START, || {
            let out = Command::new("pgrep").args(["-f", &pattern]).output().ok()?;
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        })?;
        Ok(Self { client, pid })
    }

    /// SIGKILLs the process and reaps the client.
    fn kill(mut self) -> Result<()> {
        kill_pid(self.pid)?;
        self.client.wait()?;
        Ok(())
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        // Already dead after `kill`; only a failed test leaves it running.
        let _ = Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.client.kill();
        let _ = self.client.wait();
    }
}

fn kill_pid(pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -KILL {pid} failed");
    Ok(())
}

const DIED_HINTS: &str = r#"ringlet_pleg_hints_total{kind="died"}"#;
const KERNEL_EXITS: &str = "ringlet_pleg_kernel_exits_total";
const KERNEL_EXITS_PENDING: &str = "ringlet_pleg_kernel_exits_pending";

#[test]
fn an_exec_process_is_never_taken_for_the_init_also_after_a_restart() -> Result<()> {
    if !require_ebpf_lab("an_exec_process_is_never_taken_for_the_init_also_after_a_restart") {
        return Ok(());
    }
    let mut agent = ebpf_agent("ebpf-exec-exit", &[])?;
    agent.write_manifest("execd.yaml", &busybox_pod("execd", "Never", "sleep 3601"))?;
    let pod = agent.wait_pod("execd", "running", START, |p| running(p, "main"))?;
    let id = container_id(&pod, "main")?;

    // A process exec'd into a container the agent started: not the container's first exec, not
    // pid 1 of its namespace; its death is no container death.
    ExecProcess::start(&id, "before-restart", 1002)?.kill()?;

    // After a crash the pins (and the kernel's record of each cgroup's first exec) are new: the
    // next exec'd process is the first the kernel sees in the container, so its exit is reported.
    // Only the agent's proof (the init pid the runtime reports) tells it from the init.
    agent.restart()?;
    agent.wait_pod("execd", "running after the restart", START, |p| {
        running(p, "main")
    })?;
    let died_before = agent.metric(DIED_HINTS)?;
    ExecProcess::start(&id, "after-restart", 1003)?.kill()?;
    wait_for("the exec'd process's exit hint", HINTED, || {
        (agent.metric(DIED_HINTS).ok()? > died_before).then_some(())
    })
    .with_context(|| pleg_log(&agent, "execd"))?;
    // The runtime keeps reporting the container running, which is no lag once the init (another
    // process) is known: the PLEG stops reading the pod again.
    wait_for("the PLEG to stop waiting for the runtime", HINTED, || {
        (agent.metric(AWAITING).ok()? == 0).then_some(())
    })
    .with_context(|| pleg_log(&agent, "execd"))?;
    assert_eq!(
        agent.metric(KERNEL_EXITS)?,
        0,
        "an exec'd process's exit was published as the container's"
    );
    let pod = agent.pod("execd").context("the pod left /pods")?;
    assert!(running(&pod, "main"), "{}", pod["status"]);

    // The init's own exit is published from the kernel.
    kill_pid(init_pid(&id)?)?;
    let pod = agent
        .wait_pod("execd", "terminated", HINTED, |p| {
            terminated(p, "main").is_some()
        })
        .with_context(|| pleg_log(&agent, "execd"))?;
    let main = terminated(&pod, "main").cloned().unwrap_or_default();
    assert_eq!(main["exitCode"], 137, "{main}");
    assert_eq!(main["reason"], "Error", "{main}");
    assert_eq!(agent.metric(KERNEL_EXITS)?, 1);
    Ok(())
}

#[test]
fn a_restart_after_a_kernel_published_exit_creates_one_container() -> Result<()> {
    if !require_ebpf_lab("a_restart_after_a_kernel_published_exit_creates_one_container") {
        return Ok(());
    }
    let agent = ebpf_agent("ebpf-restart-once", &[])?;
    agent.write_manifest("again.yaml", &busybox_pod("again", "Always", "sleep 3604"))?;
    let pod = agent.wait_pod("again", "running", START, |p| running(p, "main"))?;
    let id = container_id(&pod, "main")?;

    kill_pid(init_pid(&id)?)?;
    let pod = agent
        .wait_pod("again", "restarted", HINTED, |p| {
            running(p, "main")
                && container_status(p, "main").is_some_and(|c| c["restartCount"] == 1)
        })
        .with_context(|| pleg_log(&agent, "again"))?;
    let last = &container_status(&pod, "main").context("no status")?["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "{last}");
    assert_eq!(agent.metric(KERNEL_EXITS)?, 1);
    // Once containerd has reported the old container's exit too, there is still exactly one new
    // container: the kernel's exit and the runtime's were one death.
    wait_for("containerd to report the exit", HINTED, || {
        (agent.metric(KERNEL_EXITS_PENDING).ok()? == 0).then_some(())
    })
    .with_context(|| pleg_log(&agent, "again"))?;
    let containers = ringlet_tests::containers_of_node(&agent.node)?;
    assert_eq!(
        containers.len(),
        3,
        "the sandbox, the dead container and one new one: {containers:?}"
    );
    let pod = agent.pod("again").context("the pod left /pods")?;
    assert_eq!(
        container_status(&pod, "main").map(|c| c["restartCount"].clone()),
        Some(Value::from(1))
    );
    assert_eq!(
        agent.metric("ringlet_pleg_kernel_runtime_mismatch_total")?,
        0
    );
    Ok(())
}
