//! End-to-end: container log rotation by the real `ringlet` binary on the lab's containerd (the
//! kubelet's `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`). A chatty
//! container numbers its lines; its log is rotated through CRI `ReopenContainerLog`, older rotated
//! files are gzipped, no more than `containerLogMaxFiles` files are ever kept, and a
//! `/containerLogs?follow=true` reader goes on across rotations without losing or repeating a line.
//! Run as root after `cargo xtask lab up`, one test at a time.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use flate2::read::GzDecoder;
use ringlet_tests::{Agent, AgentOptions, busybox_pod, container_status, phase, require_lab};
use serde_json::Value;

const START: Duration = Duration::from_mins(1);
/// `containerLogMaxFiles` of the test: the live file, one rotated file and one compressed one.
const MAX_FILES: usize = 3;
/// The longest the follow may go without a line before the test gives up.
const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the whole follow may take: several 3 s rotation rounds and then some.
const FOLLOW_TIMEOUT: Duration = Duration::from_mins(2);
/// Rotations the follow has to live through.
const ROTATIONS: usize = 3;

/// About 500 numbered lines a second, some 20 KiB of log: every 3 s round finds the log over the
/// 16 KiB limit.
const CHATTY: &str = "i=0; while true; do j=0; while [ $j -lt 50 ]; do i=$((i+1)); j=$((j+1)); \
                      echo seq-$i; done; sleep 0.1; done";

fn running(pod: &Value) -> bool {
    phase(pod) == "Running"
        && container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
}

/// The sequence number of a `seq-<n>` line.
fn sequence(line: &str) -> Result<u64> {
    let Some(number) = line.trim().strip_prefix("seq-") else {
        bail!("unexpected log line {line:?}");
    };
    Ok(number.parse()?)
}

/// The sequence number of a CRI log file line (`<time> stdout F seq-<n>`).
fn cri_sequence(line: &str) -> Result<u64> {
    let content = line
        .splitn(4, ' ')
        .nth(3)
        .with_context(|| format!("not a CRI log line: {line:?}"))?;
    sequence(content)
}

/// The container's log directory, `/var/log/pods/default_<pod>_<uid>/main`.
fn log_dir(pod: &str) -> Result<PathBuf> {
    let prefix = format!("default_{pod}_");
    for entry in fs::read_dir("/var/log/pods")? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            return Ok(entry.path().join("main"));
        }
    }
    bail!("no log directory for {pod} in /var/log/pods")
}

/// The container's log files (`0.log` and its rotated files), sorted, without temporary files of
/// a compression in progress.
fn log_files(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(dir)?
        .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    names.retain(|name| {
        name.starts_with("0.log") && Path::new(name).extension().is_none_or(|ext| ext != "tmp")
    });
    names.sort();
    Ok(names)
}

/// The timestamp of a rotated file's name, `0.log.<YYYYMMDD-hhmmss>[.gz]`.
fn rotation_stamp(name: &str) -> Option<&str> {
    let stamp = name.strip_prefix("0.log.")?;
    let stamp = stamp.strip_suffix(".gz").unwrap_or(stamp);
    let well_formed = stamp.len() == 15
        && stamp.as_bytes()[8] == b'-'
        && stamp.bytes().filter(u8::is_ascii_digit).count() == 14;
    well_formed.then_some(stamp)
}

/// The first and last sequence numbers in a gzipped rotated file, checked to be consecutive;
/// `None` when the file was removed meanwhile (a rotation round dropped it).
fn compressed_sequences(path: &Path) -> Result<Option<(u64, u64)>> {
    let file = match fs::File::open(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        file => file?,
    };
    let mut text = String::new();
    GzDecoder::new(file)
        .read_to_string(&mut text)
        .with_context(|| format!("{} is not gzip", path.display()))?;
    let numbers = text
        .lines()
        .map(cri_sequence)
        .collect::<Result<Vec<u64>>>()?;
    let (Some(first), Some(last)) = (numbers.first(), numbers.last()) else {
        bail!("{} holds no lines", path.display());
    };
    ensure!(
        numbers.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{} skips or repeats a line",
        path.display()
    );
    Ok(Some((*first, *last)))
}

/// The first sequence number of the live file; `None` while the rotation that renamed it waits
/// for the runtime to open the next one.
fn live_first(dir: &Path) -> Result<Option<u64>> {
    let live = fs::read_to_string(dir.join("0.log")).unwrap_or_default();
    live.lines().next().map(cri_sequence).transpose()
}

/// `curl -N` following the container's log over the kubelet API; killed when dropped.
struct Follow {
    curl: Child,
    lines: mpsc::Receiver<String>,
}

impl Follow {
    fn start(agent: &Agent, path: &str) -> Result<Self> {
        let mut curl = agent.curl(true);
        // The follow outlives curl's usual limit.
        curl.args(["-N", "--max-time", "300"])
            .arg(format!(
                "https://127.0.0.1:{}{path}?follow=true",
                agent.api_port
            ))
            .stdout(Stdio::piped());
        let mut curl = curl.spawn()?;
        let stdout = curl.stdout.take().context("curl stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self { curl, lines })
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.curl.kill();
        let _ = self.curl.wait();
    }
}

/// The rotations seen in the log directory while following.
struct Rotations {
    dir: PathBuf,
    /// Rotated files there before the follow began.
    initial: BTreeSet<String>,
    /// Timestamps of the rotations since.
    seen: BTreeSet<String>,
    compressed: BTreeSet<String>,
}

impl Rotations {
    fn new(dir: PathBuf) -> Result<Self> {
        let initial = log_files(&dir)?
            .iter()
            .filter_map(|name| rotation_stamp(name).map(str::to_owned))
            .collect();
        Ok(Self {
            dir,
            initial,
            seen: BTreeSet::new(),
            compressed: BTreeSet::new(),
        })
    }

    /// Records the rotated files now there, checking that there are no more than `MAX_FILES`.
    fn look(&mut self) -> Result<()> {
        let files = log_files(&self.dir)?;
        ensure!(
            files.len() <= MAX_FILES,
            "more than containerLogMaxFiles={MAX_FILES} files: {files:?}"
        );
        for name in files.iter().filter(|name| *name != "0.log") {
            let stamp =
                rotation_stamp(name).with_context(|| format!("unexpected log file {name}"))?;
            if !self.initial.contains(stamp) {
                self.seen.insert(stamp.to_owned());
            }
            if is_compressed(name) {
                self.compressed.insert(name.clone());
            }
        }
        Ok(())
    }
}

fn is_compressed(name: &str) -> bool {
    Path::new(name).extension().is_some_and(|ext| ext == "gz")
}

/// Reads the follow, every line the one after the line before, until it has reached the live
/// file of after `ROTATIONS` rotations (one of them compressed). Returns the lines read and the
/// last number.
fn follow_across_rotations(
    agent: &Agent,
    follow: &Follow,
    rotations: &mut Rotations,
) -> Result<(u64, u64)> {
    let started = Instant::now();
    let mut previous: Option<u64> = None;
    let mut read = 0_u64;
    // The first number in the live file once enough rotations were seen.
    let mut target: Option<u64> = None;
    loop {
        ensure!(
            started.elapsed() < FOLLOW_TIMEOUT,
            "{ROTATIONS} rotations not followed within {FOLLOW_TIMEOUT:?}: saw {:?}; agent log:\n{}",
            rotations.seen,
            ringlet_tests::tail(&agent.log(), 40)
        );
        let line = follow.lines.recv_timeout(LINE_TIMEOUT).map_err(|err| {
            anyhow::anyhow!(
                "the follow stopped after line {previous:?} ({err}); agent log:\n{}",
                ringlet_tests::tail(&agent.log(), 40)
            )
        })?;
        let number = sequence(&line)?;
        if let Some(previous) = previous {
            ensure!(
                number == previous + 1,
                "line {number} followed line {previous}: a line was lost or repeated"
            );
        }
        previous = Some(number);
        read += 1;
        if target.is_some_and(|target| number >= target) {
            return Ok((read, number));
        }
        if !read.is_multiple_of(100) {
            continue;
        }
        rotations.look()?;
        if target.is_none() && rotations.seen.len() >= ROTATIONS && !rotations.compressed.is_empty()
        {
            target = live_first(&rotations.dir)?;
        }
    }
}

#[test]
fn a_chatty_log_is_rotated_compressed_bounded_and_followed_across_rotations() -> Result<()> {
    if !require_lab("a_chatty_log_is_rotated_compressed_bounded_and_followed_across_rotations") {
        return Ok(());
    }
    let agent = Agent::start(
        "log-rotation",
        AgentOptions {
            args: [
                "--container-log-max-size=16Ki",
                "--container-log-max-files=3",
                "--container-log-monitor-interval=3s",
            ]
            .map(str::to_owned)
            .to_vec(),
            ..AgentOptions::default()
        },
    )?;
    agent.write_manifest("chatty.yaml", &busybox_pod("chatty", "Always", CHATTY))?;
    agent.wait_pod("chatty", "running", START, running)?;
    let pod = format!("chatty-{}", agent.node);
    let dir = log_dir(&pod)?;

    let follow = Follow::start(&agent, &format!("/containerLogs/default/{pod}/main"))?;
    let mut rotations = Rotations::new(dir.clone())?;
    let (read, last) = follow_across_rotations(&agent, &follow, &mut rotations)?;
    drop(follow);
    eprintln!(
        "followed {read} lines up to seq-{last} across rotations {:?}; compressed: {:?}",
        rotations.seen, rotations.compressed
    );

    // What is kept on disk is gzip holding whole, consecutive CRI lines, and older than the live
    // file.
    let files = log_files(&dir)?;
    ensure!(files.len() <= MAX_FILES, "{files:?}");
    let live_first = live_first(&dir)?;
    let mut checked = 0;
    for name in files.iter().filter(|name| is_compressed(name)) {
        let Some((_, last_in_file)) = compressed_sequences(&dir.join(name))? else {
            continue;
        };
        checked += 1;
        if let Some(live_first) = live_first {
            ensure!(
                last_in_file < live_first,
                "{name} ends at seq-{last_in_file}, after the live file's start seq-{live_first}"
            );
        }
    }
    ensure!(checked > 0, "no compressed file left to check: {files:?}");
    Ok(())
}
