//! Chaos (issue 14 §2): the agent under faults, on the lab's containerd. Each case asserts that
//! nothing is lost and nothing doubled: pods that ran before keep their container ids (none is
//! re-created), every exit that happened is reported with its exit code, and nothing of a pod
//! (containers, sandboxes, pod cgroups, pod directory) is left once it is gone. Run as root after
//! `cargo xtask lab up`, one test at a time. The faults: the agent killed over and over while pods
//! churn, containerd stopped under it, its root dir's disk full (`events.log` included), and every
//! CRI call hanging for longer than the PLEG's relist threshold.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ringlet::pleg::RELIST_THRESHOLD;
use ringlet_tests::cluster::run;
use ringlet_tests::stalling_proxy::StallingProxy;
use ringlet_tests::{
    Agent, AgentOptions, CONTAINERD_SOCKET, busybox_pod, container_labels, container_status,
    containers_of_node, http_get, lab_containerd, phase, pod_cgroups_of, require_lab,
    restart_lab_containerd, task, wait_for,
};
use serde_json::Value;

/// Upper bound for the node to settle after the last fault (dozens of pods to start or adopt).
const SETTLE: Duration = Duration::from_mins(2);
/// The env variable that replays the agent-kill case with a given seed (printed by every run).
const SEED_ENV: &str = "RINGLET_CHAOS_SEED";
/// Pods running before the faults start; they must come through untouched.
const STEADY_PODS: usize = 10;

/// The running container's id of a `/pods` entry's `main` container.
fn running_id(pod: &Value) -> Option<String> {
    let status = container_status(pod, "main")?;
    status["state"]["running"].is_object().then(|| {
        status["containerID"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("containerd://")
            .to_owned()
    })
}

fn restart_count(pod: &Value) -> u64 {
    container_status(pod, "main").map_or(0, |c| c["restartCount"].as_u64().unwrap_or(0))
}

/// The `/pods` entries by their static pod name without the node suffix.
fn pods_by_name(agent: &Agent) -> Result<BTreeMap<String, Value>> {
    let suffix = format!("-{}", agent.node);
    Ok(agent
        .pods()?
        .into_iter()
        .filter_map(|pod| {
            let name = pod["metadata"]["name"].as_str()?.strip_suffix(&suffix)?;
            Some((name.to_owned(), pod))
        })
        .collect())
}

/// The node's containers (not sandboxes) in containerd, by pod name without the node suffix.
fn containers_by_pod(node: &str) -> Result<BTreeMap<String, Vec<String>>> {
    let suffix = format!("-{node}");
    let mut by_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in containers_of_node(node)? {
        let labels = container_labels(&id)?;
        if labels["io.cri-containerd.kind"] != "container" {
            continue;
        }
        let pod = labels["io.kubernetes.pod.name"]
            .as_str()
            .unwrap_or_default();
        let pod = pod.strip_suffix(&suffix).unwrap_or(pod).to_owned();
        by_pod.entry(pod).or_default().push(id);
    }
    Ok(by_pod)
}

/// Writes `names` as busybox pods running `command` and waits until all of them run; returns
/// their container ids.
fn start_pods(
    agent: &Agent,
    names: &[String],
    restart_policy: &str,
    command: &str,
) -> Result<BTreeMap<String, String>> {
    for name in names {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &busybox_pod(name, restart_policy, command),
        )?;
    }
    wait_for("the pods to run", SETTLE, || {
        let pods = pods_by_name(agent).ok()?;
        names
            .iter()
            .map(|name| Some((name.clone(), running_id(pods.get(name)?)?)))
            .collect::<Option<BTreeMap<_, _>>>()
    })
}

/// Removes every manifest and checks that nothing of the pods with `uids` is left: containers,
/// sandboxes, pod cgroups and pod directories.
fn remove_all_and_check_nothing_is_left(agent: &Agent, uids: &BTreeSet<String>) -> Result<()> {
    for entry in std::fs::read_dir(agent.manifests())? {
        std::fs::remove_file(entry?.path())?;
    }
    wait_for("every container and sandbox to be removed", SETTLE, || {
        containers_of_node(&agent.node)
            .ok()?
            .is_empty()
            .then_some(())
    })?;
    wait_for(
        "every pod cgroup and pod directory to be removed",
        SETTLE,
        || {
            uids.iter()
                .all(|uid| {
                    pod_cgroups_of(uid).is_empty()
                        && !agent.root_dir().join("pods").join(uid).exists()
                })
                .then_some(())
        },
    )
    .with_context(|| {
        let left: Vec<String> = uids.iter().flat_map(|uid| pod_cgroups_of(uid)).collect();
        format!("cgroups left: {left:?}")
    })
}

/// Each steady pod in `pods` still runs the container it had (`steady`: name → container id), and
/// never restarted.
fn assert_steady_pods_untouched(pods: &BTreeMap<String, Value>, steady: &BTreeMap<String, String>) {
    for (name, id) in steady {
        assert_eq!(
            pods.get(name).and_then(running_id).as_deref(),
            Some(id.as_str()),
            "{name} kept its container"
        );
        assert_eq!(
            pods.get(name).map(restart_count),
            Some(0),
            "{name} never restarted"
        );
    }
}

/// After one SIGKILL of pod `victim`'s container: the steady pods are untouched, each with one
/// container in containerd (none re-created), and the victim restarted once, its last state the
/// kill's exit code.
fn assert_the_victim_died_once_and_nothing_doubled(
    agent: &Agent,
    settled: &BTreeMap<String, Value>,
    steady: &BTreeMap<String, String>,
) -> Result<()> {
    assert_steady_pods_untouched(settled, steady);
    let victim_status = container_status(&settled["victim"], "main").context("no victim status")?;
    assert_eq!(
        victim_status["restartCount"], 1,
        "the victim died once: {victim_status}"
    );
    assert_eq!(
        victim_status["lastState"]["terminated"]["exitCode"], 137,
        "the exit is reported with its code: {victim_status}"
    );
    let by_pod = containers_by_pod(&agent.node)?;
    for name in steady.keys() {
        assert_eq!(
            by_pod.get(name).map(Vec::len),
            Some(1),
            "{name}: nothing doubled"
        );
    }
    Ok(())
}

/// The UIDs `/pods` shows now, added to `uids`.
fn note_uids(agent: &Agent, uids: &mut BTreeSet<String>) {
    for pod in agent.pods().unwrap_or_default() {
        if let Some(uid) = pod["metadata"]["uid"].as_str() {
            uids.insert(uid.to_owned());
        }
    }
}

/// What keeps the node from having settled after the kills, one line per pod: the steady pods run
/// without a restart, the churning ones run, the crash pods failed with exit code 3, the removed
/// ones are gone.
fn unsettled_after_kills(
    pods: &BTreeMap<String, Value>,
    steady: &BTreeMap<String, String>,
    churning: &[String],
    crashing: &[String],
    removed: &[String],
) -> Vec<String> {
    let main_status = |name: &str| {
        pods.get(name)
            .and_then(|p| container_status(p, "main"))
            .map_or_else(|| "no status".to_owned(), ToString::to_string)
    };
    let mut unsettled = Vec::new();
    for name in steady.keys() {
        let ok = pods
            .get(name)
            .is_some_and(|p| running_id(p).is_some() && restart_count(p) == 0);
        if !ok {
            unsettled.push(format!("steady {name}: {}", main_status(name)));
        }
    }
    for name in churning {
        if pods.get(name).and_then(running_id).is_none() {
            unsettled.push(format!("churning {name}: {}", main_status(name)));
        }
    }
    for name in crashing {
        let ok = pods.get(name).is_some_and(|p| {
            phase(p) == "Failed"
                && container_status(p, "main")
                    .is_some_and(|c| c["state"]["terminated"]["exitCode"] == 3)
        });
        if !ok {
            let phase = pods.get(name).map_or("absent", phase);
            unsettled.push(format!("crash {name} ({phase}): {}", main_status(name)));
        }
    }
    for name in removed.iter().filter(|name| pods.contains_key(*name)) {
        unsettled.push(format!(
            "removed {name} still listed: {}",
            main_status(name)
        ));
    }
    unsettled
}

#[test]
fn the_agent_killed_twenty_times_while_pods_churn_loses_and_doubles_nothing() -> Result<()> {
    const KILLS: usize = 20;
    let test = "the_agent_killed_twenty_times_while_pods_churn_loses_and_doubles_nothing";
    if !require_lab(test) {
        return Ok(());
    }
    let seed = match std::env::var(SEED_ENV) {
        Ok(seed) => seed
            .parse()
            .with_context(|| format!("{SEED_ENV}={seed} is not a u64"))?,
        Err(_) => fastrand::u64(..),
    };
    println!("{test}: seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = std::time::Instant::now();
    let mut agent = Agent::start("chaos-kill", AgentOptions::default())?;
    let steady_names: Vec<String> = (0..STEADY_PODS).map(|i| format!("steady-{i}")).collect();
    let steady = start_pods(&agent, &steady_names, "Always", "exec sleep 3600")?;
    let mut uids = BTreeSet::new();
    note_uids(&agent, &mut uids);

    let (mut churning, mut removed, mut crashing) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..KILLS {
        let name = format!("churn-{round}");
        agent.write_manifest(
            &format!("{name}.yaml"),
            &busybox_pod(&name, "Always", "exec sleep 3600"),
        )?;
        churning.push(name);
        if round % 2 == 1 {
            let gone = churning.remove(0);
            agent.remove_manifest(&format!("{gone}.yaml"))?;
            removed.push(gone);
        }
        if round % 4 == 0 {
            let name = format!("crash-{round}");
            agent.write_manifest(
                &format!("{name}.yaml"),
                &busybox_pod(&name, "Never", "sleep 1; exit 3"),
            )?;
            crashing.push(name);
        }
        // The kill lands at a random point of whatever the agent is doing with the changes.
        std::thread::sleep(Duration::from_millis(rng.u64(0..1_500)));
        note_uids(&agent, &mut uids);
        agent.restart()?;
    }

    println!("{test}: {KILLS} kills done after {:?}", started.elapsed());
    let mut unsettled = Vec::new();
    let settled = wait_for("the node to settle after the last kill", SETTLE, || {
        let pods = pods_by_name(&agent).ok()?;
        unsettled = unsettled_after_kills(&pods, &steady, &churning, &crashing, &removed);
        unsettled.is_empty().then_some(pods)
    })
    .with_context(|| {
        format!(
            "seed {seed}: still unsettled: {unsettled:#?}\nagent log:\n{}",
            ringlet_tests::tail(&agent.log(), 80)
        )
    })?;
    note_uids(&agent, &mut uids);

    for (name, id) in &steady {
        assert_eq!(
            running_id(&settled[name]).as_deref(),
            Some(id.as_str()),
            "{name} runs the container it ran before the kills"
        );
    }
    // A crash pod's count of starts is not asserted: an agent killed between CreateContainer and
    // StartContainer leaves a container that never ran, which the next agent replaces (the
    // kubelet's rule for a container in the created state), so even a `Never` pod may show one
    // restart. Its exit is asserted above: Failed with exit code 3.
    let containers = wait_for("the removed pods' containers to go", SETTLE, || {
        let containers = containers_by_pod(&agent.node).ok()?;
        removed
            .iter()
            .all(|name| !containers.contains_key(name))
            .then_some(containers)
    })?;
    for name in steady.keys() {
        assert_eq!(
            containers.get(name).map(Vec::len),
            Some(1),
            "{name}: one container, none re-created"
        );
    }
    println!("{test}: settled after {:?}", started.elapsed());
    remove_all_and_check_nothing_is_left(&agent, &uids).with_context(|| {
        format!(
            "seed {seed}: agent log:\n{}",
            ringlet_tests::tail(&agent.log(), 80)
        )
    })
}

#[test]
fn containerd_stopped_for_twenty_seconds_under_the_agent_loses_and_doubles_nothing() -> Result<()> {
    let test = "containerd_stopped_for_twenty_seconds_under_the_agent_loses_and_doubles_nothing";
    if !require_lab(test) {
        return Ok(());
    }
    let agent = Agent::start("chaos-containerd", AgentOptions::default())?;
    let names: Vec<String> = (0..5).map(|i| format!("steady-{i}")).collect();
    let steady = start_pods(&agent, &names, "Always", "exec sleep 3600")?;
    let victim = start_pods(&agent, &["victim".to_owned()], "Always", "exec sleep 3600")?;
    let mut uids = BTreeSet::new();
    note_uids(&agent, &mut uids);
    let (victim_pid, _) = task(&victim["victim"])?.context("the victim has no task")?;

    let containerd = lab_containerd();
    let command_line = containerd
        .command_line()?
        .context("the lab's containerd is not running")?;
    containerd.stop(Duration::from_secs(15))?;
    // While containerd is away the victim's process dies: only the kernel sees it.
    let killed = ringlet_tests::daemon::signal(victim_pid, libc::SIGKILL);
    // The fault is containerd missing for a while; the agent must ride it out.
    std::thread::sleep(Duration::from_secs(20));
    let answered_meanwhile = http_get(agent.healthz_port, "/healthz");
    // Started again whatever happened, so a failure here does not leave the lab broken.
    restart_lab_containerd(&containerd, &command_line)?;
    if !killed {
        bail!("could not kill the victim's process {victim_pid}");
    }
    answered_meanwhile.context("the agent stopped answering /healthz while containerd was down")?;

    let settled = wait_for(
        "the node to settle after containerd is back",
        SETTLE,
        || {
            let pods = pods_by_name(&agent).ok()?;
            let steady_ok = steady
                .keys()
                .all(|name| pods.get(name).and_then(running_id).is_some());
            let victim_ok = pods
                .get("victim")
                .is_some_and(|p| running_id(p).is_some() && restart_count(p) >= 1);
            (steady_ok && victim_ok).then_some(pods)
        },
    )
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 80)))?;
    assert_the_victim_died_once_and_nothing_doubled(&agent, &settled, &steady)?;
    wait_for("the agent to turn healthy again", SETTLE, || {
        let (code, body) = http_get(agent.healthz_port, "/healthz").ok()?;
        (code == 200 && body == "ok").then_some(())
    })?;
    remove_all_and_check_nothing_is_left(&agent, &uids)
}

/// A tmpfs of `size` mounted on a fresh directory; unmounted (lazily, so a process still holding a
/// file there cannot keep it) and removed on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("chaos-tmpfs-").tempdir()?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path()))?;
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run(Command::new("umount").arg("-l").arg(self.dir.path()));
    }
}

/// Fills the file system of `dir` by appending to `filler` until a write fails with ENOSPC.
fn fill(filler: &Path) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(filler)?;
    let block = vec![0u8; 4096];
    loop {
        match file.write_all(&block) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => return Ok(()),
            Err(err) => return Err(err).context("filling the tmpfs"),
        }
    }
}

/// Frees the page `file` ends in (a hole punched in it), so that the next append to it needs a
/// new page: on a full file system, it fails.
fn punch_last_page(file: &Path) -> Result<()> {
    let size = std::fs::metadata(file)?.len();
    let start = size / 4096 * 4096;
    run(Command::new("fallocate")
        .args([
            "--punch-hole",
            "--offset",
            &start.to_string(),
            "--length",
            "4096",
        ])
        .arg(file))?;
    Ok(())
}

/// Kills the running `main` container of pod `name` and waits until `/pods` reports the exit with
/// code 137 (as the container's state while no restart succeeds, or as its last state after one).
fn kill_and_see_the_exit(agent: &Agent, name: &str, deaths_before: u64) -> Result<()> {
    let pods = pods_by_name(agent)?;
    let id = pods
        .get(name)
        .and_then(running_id)
        .with_context(|| format!("{name} is not running"))?;
    let (pid, _) = task(&id)?.with_context(|| format!("{name}'s container has no task"))?;
    ensure!(
        ringlet_tests::daemon::signal(pid, libc::SIGKILL),
        "could not kill {name}'s process {pid}"
    );
    wait_for(
        &format!("{name}'s exit reported with its code"),
        SETTLE,
        || {
            let pods = pods_by_name(agent).ok()?;
            let pod = pods.get(name)?;
            let status = container_status(pod, "main")?;
            let terminated = &status["state"]["terminated"];
            let reported = if terminated.is_object() {
                terminated["exitCode"] == 137
                    && terminated["containerID"] == format!("containerd://{id}")
            } else {
                restart_count(pod) > deaths_before
                    && status["lastState"]["terminated"]["exitCode"] == 137
            };
            reported.then_some(())
        },
    )
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 80)))
}

#[test]
fn a_full_disk_and_an_unwritable_event_log_lose_and_double_nothing() -> Result<()> {
    let test = "a_full_disk_and_an_unwritable_event_log_lose_and_double_nothing";
    if !require_lab(test) {
        return Ok(());
    }
    // Dropped after the agent: the agent stops before its root dir goes.
    let disk = Tmpfs::mount("64m")?;
    let agent = Agent::start(
        "chaos-disk",
        AgentOptions {
            root_dir: Some(disk.path().join("root")),
            ..AgentOptions::default()
        },
    )?;
    let names: Vec<String> = (0..3).map(|i| format!("steady-{i}")).collect();
    let steady = start_pods(&agent, &names, "Always", "exec sleep 3600")?;
    start_pods(&agent, &["victim".to_owned()], "Always", "exec sleep 3600")?;
    let mut uids = BTreeSet::new();
    note_uids(&agent, &mut uids);

    // The root dir's disk full, the event log's last page included: its next line cannot be
    // written. A container exit is still reported with its code, a pod added meanwhile is not
    // lost, the agent says what it cannot write and stays healthy.
    let filler = disk.path().join("filler");
    fill(&filler)?;
    punch_last_page(&agent.root_dir().join("events.log"))?;
    fill(&filler)?;
    agent.write_manifest(
        "newcomer.yaml",
        &busybox_pod("newcomer", "Always", "exec sleep 3600"),
    )?;
    kill_and_see_the_exit(&agent, "victim", 0)?;
    wait_for(
        "the agent to say the event log is unwritable",
        SETTLE,
        || {
            agent
                .log()
                .contains("cannot append to the event log")
                .then_some(())
        },
    )?;
    let (code, body) = http_get(agent.healthz_port, "/healthz")?;
    ensure!(
        code == 200,
        "the agent is unhealthy with its disk full: {body}"
    );

    std::fs::remove_file(&filler)?;
    let settled = wait_for(
        "the newcomer and the victim to run once there is room",
        SETTLE,
        || {
            let pods = pods_by_name(&agent).ok()?;
            let running = |name: &str| pods.get(name).and_then(running_id).is_some();
            (running("newcomer") && running("victim")).then_some(pods)
        },
    )
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 80)))?;
    wait_for("the event log to be written again", SETTLE, || {
        agent
            .log()
            .contains("appending to the event log works again")
            .then_some(())
    })?;
    assert_the_victim_died_once_and_nothing_doubled(&agent, &settled, &steady)?;
    note_uids(&agent, &mut uids);
    remove_all_and_check_nothing_is_left(&agent, &uids)
}

#[test]
fn a_hanging_runtime_turns_the_pleg_unhealthy_and_loses_and_doubles_nothing() -> Result<()> {
    let test = "a_hanging_runtime_turns_the_pleg_unhealthy_and_loses_and_doubles_nothing";
    if !require_lab(test) {
        return Ok(());
    }
    // Declared before the agent, so they are dropped after it: it removes its pods through them.
    let socket_dir = tempfile::tempdir()?;
    let proxy = StallingProxy::start(
        &socket_dir.path().join("cri.sock"),
        Path::new(CONTAINERD_SOCKET),
    )?;
    let agent = Agent::start(
        "chaos-stall",
        AgentOptions {
            runtime_socket: Some(proxy.socket().to_path_buf()),
            ..AgentOptions::default()
        },
    )?;
    let names: Vec<String> = (0..3).map(|i| format!("steady-{i}")).collect();
    let steady = start_pods(&agent, &names, "Always", "exec sleep 3600")?;
    let victim = start_pods(&agent, &["victim".to_owned()], "Always", "exec sleep 3600")?;
    let mut uids = BTreeSet::new();
    note_uids(&agent, &mut uids);
    let (victim_pid, _) = task(&victim["victim"])?.context("the victim has no task")?;

    // Every CRI call hangs from now on; the victim dies meanwhile. After the relist threshold
    // without a completed relist the PLEG reports unhealthy, while the agent keeps answering.
    proxy.stall();
    let killed = ringlet_tests::daemon::signal(victim_pid, libc::SIGKILL);
    let unhealthy = wait_for(
        "the PLEG to turn unhealthy",
        RELIST_THRESHOLD + Duration::from_mins(1),
        || {
            let (code, body) = http_get(agent.healthz_port, "/healthz/pleg").ok()?;
            (code != 200).then_some(body)
        },
    );
    let overall = http_get(agent.healthz_port, "/healthz");
    // Released whatever happened, so a failure here does not strand the agent's pods.
    proxy.release();
    ensure!(killed, "could not kill the victim's process {victim_pid}");
    let unhealthy = unhealthy
        .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 40)))?;
    ensure!(
        unhealthy.contains("pleg was last seen active"),
        "/healthz/pleg says why: {unhealthy}"
    );
    let (code, body) = overall.context("the agent stopped answering /healthz")?;
    ensure!(code == 500, "/healthz is unhealthy too: {code} {body}");

    wait_for("the agent to turn healthy again", SETTLE, || {
        let (code, body) = http_get(agent.healthz_port, "/healthz").ok()?;
        (code == 200 && body == "ok").then_some(())
    })
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 40)))?;
    let settled = wait_for("the victim to run again", SETTLE, || {
        let pods = pods_by_name(&agent).ok()?;
        let victim = pods.get("victim")?;
        (running_id(victim).is_some() && restart_count(victim) >= 1).then_some(pods)
    })
    .with_context(|| format!("agent log:\n{}", ringlet_tests::tail(&agent.log(), 80)))?;
    assert_the_victim_died_once_and_nothing_doubled(&agent, &settled, &steady)?;
    remove_all_and_check_nothing_is_left(&agent, &uids)
}
