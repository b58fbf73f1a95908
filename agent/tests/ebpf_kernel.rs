//! The eBPF hint source on the real kernel: loads and attaches the programs with a temporary pods'
//! parent cgroup, makes container cgroups and processes in them, and checks the hints, the drop
//! accounting, the reader thread's wake-ups and stop, and the pins. Needs root, kernel BTF, a
//! cgroup2 hierarchy and bpffs: skips (with the reason) without them, and fails instead when
//! CI=true.

use std::ffi::CString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ringlet::container::{ContainerId, PodUid};
use ringlet::ebpf::{EbpfHandle, EbpfOptions, start};
use ringlet::pleg::{Hint, HintKind, PodHint};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

const UID: &str = "7d0c1f42-3b5e-4a7c-9f10-2e8d6b4a5c01";

fn container_id(n: u32) -> String {
    format!("{n:08x}{}", "ab".repeat(28))
}

/// The cgroup2 mount, or why the test cannot run.
fn preconditions() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    if !Path::new("/sys/fs/bpf").is_dir() {
        return Err("no bpffs at /sys/fs/bpf".into());
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if !right.starts_with("cgroup2 ") {
                return None;
            }
            left.split(' ').nth(4).map(PathBuf::from)
        })
        .ok_or_else(|| "no cgroup2 hierarchy mounted".into())
}

/// Runs the test body when the machine allows, else says why it is skipped (or fails under CI).
fn require() -> Option<PathBuf> {
    match preconditions() {
        Ok(root) => Some(root),
        Err(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the eBPF kernel test cannot run under CI: {reason}")
        }
        Err(reason) => {
            eprintln!("SKIP: the eBPF kernel test needs root, BTF, bpffs and cgroup2: {reason}");
            None
        }
    }
}

/// Removes a cgroup tree (deepest first) on drop, also when the test fails.
struct CgroupTree(PathBuf);

impl Drop for CgroupTree {
    fn drop(&mut self) {
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&entry.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.0);
    }
}

/// Removes a pin directory's leftovers if the handle did not (a failed test).
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The reader's drop-counter reads, as the test sees them, and a gate to hold the reader thread in
/// one. The reader reads the counter on every wake-up and hands it to its observer on its own
/// thread, so while the test holds the gate the reader is stuck like a starved reader and kernel
/// events pile up in the ring buffer.
struct DropReads {
    gate: Arc<Mutex<()>>,
    reads: std::sync::mpsc::Receiver<u64>,
}

fn drop_reads() -> (DropReads, impl FnMut(u64) + Send + 'static) {
    let gate = Arc::new(Mutex::new(()));
    let (sender, reads) = std::sync::mpsc::channel();
    let held = Arc::clone(&gate);
    let observer = move |total| {
        let _ = sender.send(total);
        drop(held.lock());
    };
    (DropReads { gate, reads }, observer)
}

impl DropReads {
    /// The next drop count the reader reads, or a failure after 5 s.
    fn next(&self) -> u64 {
        self.reads
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the reader did not read the drop counter: {e}"))
    }

    /// Wakes the idle reader with a check request and keeps it in that read of the drop counter
    /// until the returned guard drops.
    fn hold(&self, handle: &EbpfHandle) -> MutexGuard<'_, ()> {
        let guard = self
            .gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while self.reads.try_recv().is_ok() {}
        handle.source_check().request();
        assert_eq!(self.next(), 0, "nothing was lost before the test began");
        guard
    }
}

struct Setup {
    handle: EbpfHandle,
    hints: mpsc::Receiver<Hint>,
    drop_reads: DropReads,
    parent: PathBuf,
    pin_dir: PathBuf,
    // Clean up after a failed test; a passing one drops the handle first, which removes the pins.
    _pins: PinDir,
    _cgroups: CgroupTree,
}

fn setup(root: &Path, name: &str, ring_buffer_bytes: u32, channel: usize) -> Setup {
    let parent = root.join(format!("ringlet-test-{name}-{}", std::process::id()));
    let pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/ringlet-test-{name}-{}",
        std::process::id()
    ));
    let cgroups = CgroupTree(parent.clone());
    let pins = PinDir(pin_dir.clone());
    let (tx, hints) = mpsc::channel(channel);
    let options = EbpfOptions {
        pods_cgroup: parent.clone(),
        ring_buffer_bytes,
        pin_dir: pin_dir.clone(),
    };
    let (drop_reads, observer) = drop_reads();
    let handle = start(options, tx, observer)
        .unwrap_or_else(|e| panic!("starting the eBPF hint source: {e:?}"));
    Setup {
        handle,
        hints,
        drop_reads,
        parent,
        pin_dir,
        _pins: pins,
        _cgroups: cgroups,
    }
}

/// Receives hints until `done` says so, or fails after 5 s with what arrived.
async fn collect(hints: &mut mpsc::Receiver<Hint>, done: impl Fn(&[Hint]) -> bool) -> Vec<Hint> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !done(&seen) {
        match tokio::time::timeout_at(deadline, hints.recv()).await {
            Ok(Some(hint)) => seen.push(hint),
            Ok(None) => panic!("the hint channel closed; got {seen:#?}"),
            Err(tokio::time::error::Elapsed { .. }) => {
                panic!("timed out waiting for hints; got {seen:#?}")
            }
        }
    }
    seen
}

fn pod_hint(hints: &[Hint], kind: HintKind) -> Option<&PodHint> {
    hints.iter().find_map(|hint| match hint {
        Hint::Pod(pod) if pod.kind == kind => Some(pod),
        _ => None,
    })
}

/// Runs `args` with the child moved into every cgroup whose `cgroup.procs` is in `procs` (before
/// exec, so the exec happens there).
fn run_in(procs: &[PathBuf], args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    let procs = procs
        .iter()
        .map(|p| CString::new(p.clone().into_os_string().into_encoded_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut command = Command::new(args[0]);
    command.args(&args[1..]);
    // SAFETY: the closure only calls async-signal-safe functions (open, write, close).
    unsafe {
        command.pre_exec(move || {
            for file in &procs {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.status()
}

/// `bpftool` (when installed) dumps the pinned maps and finds the programs by name and the pinned
/// links.
fn check_with_bpftool(handle: &EbpfHandle, pin_dir: &Path) {
    if Command::new("bpftool").arg("version").output().is_ok() {
        for map in [ringlet_ebpf::DROPS_MAP, ringlet_ebpf::STARTED_MAP] {
            let out = Command::new("bpftool")
                .args(["map", "dump", "pinned"])
                .arg(pin_dir.join(map))
                .output()
                .unwrap_or_else(|e| panic!("running bpftool: {e}"));
            assert!(
                out.status.success(),
                "bpftool map dump {map}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for name in handle.attached_programs() {
            let out = Command::new("bpftool")
                .args(["prog", "show", "name", name])
                .output()
                .unwrap_or_else(|e| panic!("running bpftool: {e}"));
            let listing = String::from_utf8_lossy(&out.stdout);
            assert!(
                listing.contains(&format!("name {name} ")),
                "bpftool prog show name {name}: {listing}"
            );
            let out = Command::new("bpftool")
                .args(["link", "show", "pinned"])
                .arg(pin_dir.join(name))
                .output()
                .unwrap_or_else(|e| panic!("running bpftool: {e}"));
            assert!(
                out.status.success(),
                "bpftool link show pinned {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[tokio::test]
async fn container_lifecycle_in_the_kernel_becomes_hints_and_pins_come_and_go() {
    let Some(root) = require() else { return };
    let Setup {
        handle,
        mut hints,
        parent,
        pin_dir,
        _pins,
        _cgroups,
        ..
    } = setup(&root, "life", 1 << 16, 1024);

    for name in ringlet_ebpf::MAPS.iter().chain(handle.attached_programs()) {
        assert!(
            pin_dir.join(name).exists(),
            "{name} is not pinned in {}",
            pin_dir.display()
        );
    }
    assert_eq!(
        handle.attached_programs().len(),
        ringlet_ebpf::PROGRAMS.len(),
        "every program attaches on this kernel"
    );
    check_with_bpftool(&handle, &pin_dir);

    let id = container_id(1);
    let container = parent
        .join("besteffort")
        .join(format!("pod{UID}"))
        .join(&id);
    std::fs::create_dir_all(&container).unwrap();
    // `sh -c 'exit 3'` as pid 1 of a new pid namespace, in the container cgroup.
    let status = run_in(
        &[container.join("cgroup.procs")],
        &["unshare", "--pid", "--fork", "sh", "-c", "exit 3"],
    )
    .unwrap();
    assert_eq!(status.code(), Some(3));

    let seen = collect(&mut hints, |seen| pod_hint(seen, HintKind::Died).is_some()).await;
    let expect = |kind| {
        let hint = pod_hint(&seen, kind).unwrap_or_else(|| panic!("no {kind:?} hint in {seen:#?}"));
        assert_eq!(hint.pod, PodUid::new(UID));
        assert_eq!(hint.container, Some(ContainerId::new(id.clone())));
        assert!(hint.kernel_time_ns > 0);
        hint.clone()
    };
    expect(HintKind::CgroupCreated);
    expect(HintKind::Started);
    let died = expect(HintKind::Died);
    assert_eq!((died.exit_code, died.signal), (Some(3), None));
    assert!(
        !seen.iter().any(|h| matches!(h, Hint::Resync { .. })),
        "no events were lost: {seen:#?}"
    );

    std::fs::remove_dir(&container).unwrap();
    let seen = collect(&mut hints, |seen| {
        pod_hint(seen, HintKind::CgroupRemoved).is_some()
    })
    .await;
    assert_eq!(
        pod_hint(&seen, HintKind::CgroupRemoved).unwrap().container,
        Some(ContainerId::new(id))
    );
    assert_eq!(handle.dropped_events(), 0);
    assert!(handle.events_read() >= 4);

    drop(handle);
    assert!(
        !pin_dir.exists(),
        "the pins outlive the handle: {:?}",
        std::fs::read_dir(&pin_dir).map(Iterator::count)
    );
    // The reader thread was stopped and joined with the handle: its sender is gone.
    loop {
        match hints.try_recv() {
            Ok(_) => {}
            Err(error) => {
                assert_eq!(
                    error,
                    TryRecvError::Disconnected,
                    "the reader outlives the handle"
                );
                break;
            }
        }
    }
}

#[tokio::test]
async fn a_full_ring_buffer_counts_drops_and_asks_for_a_resync() {
    let Some(root) = require() else { return };
    // SAFETY: sysconf only reads a configuration value.
    let page = u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
    // One page holds 17 events; the reader is held while the burst runs.
    let Setup {
        handle,
        mut hints,
        drop_reads,
        parent,
        _pins,
        _cgroups,
        ..
    } = setup(&root, "overflow", page, 1024);
    let pod = parent.join(format!("pod{UID}"));
    let held = drop_reads.hold(&handle);
    for n in 0..100 {
        std::fs::create_dir_all(pod.join(container_id(n))).unwrap();
    }
    let dropped = handle.dropped_events();
    assert!(dropped > 0, "no drops counted");
    drop(held);
    let seen = collect(&mut hints, |seen| {
        seen.iter().any(|h| matches!(h, Hint::Resync { .. }))
    })
    .await;
    let created = seen
        .iter()
        .filter(|h| matches!(h, Hint::Pod(p) if p.kind == HintKind::CgroupCreated))
        .count();
    assert!(
        created < 100,
        "all {created} events fit a one-page ring buffer?"
    );
    assert_eq!(handle.resyncs(), 1);
    assert_eq!(
        drop_reads.next(),
        dropped,
        "the reader reports what it read (the agent's drops metric)"
    );
    drop(handle);
}

#[tokio::test]
async fn a_full_hint_channel_becomes_one_resync_once_there_is_room() {
    let Some(root) = require() else { return };
    let Setup {
        handle,
        mut hints,
        drop_reads,
        parent,
        _pins,
        _cgroups,
        ..
    } = setup(&root, "channel", 1 << 16, 2);
    let pod = parent.join(format!("pod{UID}"));
    // Held, so the reader finds all ten events at once.
    let held = drop_reads.hold(&handle);
    for n in 0..10 {
        std::fs::create_dir_all(pod.join(container_id(n))).unwrap();
    }
    drop(held);
    // The reader reads the drop counter after the batch: by then it has filled the channel, lost
    // the rest and owes the resync. Nothing in the kernel wakes it after that; only the room the
    // test makes by receiving lets the resync out.
    assert_eq!(drop_reads.next(), 0);
    let seen = collect(&mut hints, |seen| {
        seen.iter().any(|h| matches!(h, Hint::Resync { .. }))
    })
    .await;
    assert_eq!(handle.dropped_events(), 0);
    assert_eq!(handle.hints_lost(), 8);
    // The two that fit, then the resync that stands for the rest.
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(matches!(seen[2], Hint::Resync { .. }), "{seen:#?}");
    assert_eq!(handle.resyncs(), 1);
    drop(handle);
}

/// Set in the child process that plays the crashed agent: the pin directory and pods' cgroup to use.
const CRASH_CHILD_ENV: &str = "RINGLET_TEST_CRASH_CHILD";

#[tokio::test]
async fn a_second_agent_on_live_pins_is_refused_naming_the_holder() {
    let Some(root) = require() else { return };
    let Setup {
        handle,
        parent,
        pin_dir,
        _pins,
        _cgroups,
        ..
    } = setup(&root, "second", 1 << 16, 16);
    let live_id = std::fs::metadata(pin_dir.join(ringlet_ebpf::EVENTS_MAP)).map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.ino()
    });
    let (tx, _hints) = mpsc::channel(16);
    let options = EbpfOptions {
        pods_cgroup: parent.clone(),
        ring_buffer_bytes: 1 << 16,
        pin_dir: pin_dir.clone(),
    };
    match start(options, tx, |_| {}) {
        Err(ringlet::ebpf::EbpfError::PinsInUse { path, holder }) => {
            assert_eq!(path, pin_dir);
            assert!(
                holder.contains(&std::process::id().to_string()),
                "the holder should name this process: {holder:?}"
            );
        }
        Err(other) => panic!("expected PinsInUse, got {other:?}"),
        Ok(_) => panic!("a second agent took the live pin directory"),
    }
    let still_id = std::fs::metadata(pin_dir.join(ringlet_ebpf::EVENTS_MAP)).map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.ino()
    });
    assert_eq!(
        live_id.unwrap(),
        still_id.unwrap(),
        "the refused agent touched the live pins"
    );
    drop(handle);
    assert!(!pin_dir.exists());
}

#[tokio::test]
async fn pins_left_by_a_crashed_run_are_replaced() {
    if let Ok(dirs) = std::env::var(CRASH_CHILD_ENV) {
        run_until_killed(&dirs);
    }
    let Some(root) = require() else { return };
    let parent = root.join(format!("ringlet-test-stale-{}", std::process::id()));
    let pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/ringlet-test-stale-{}",
        std::process::id()
    ));
    let _cgroups = CgroupTree(parent.clone());
    let _pins = PinDir(pin_dir.clone());
    // A real crash: another process loads and pins, then dies by SIGKILL, which runs no clean-up
    // and releases its lock on the pin directory only because the kernel closes its files.
    let mut crashed = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "pins_left_by_a_crashed_run_are_replaced",
                "--nocapture",
            ])
            .env(
                CRASH_CHILD_ENV,
                format!("{}\n{}", parent.display(), pin_dir.display()),
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = std::io::BufReader::new(crashed.0.stdout.take().unwrap());
    let ready = std::io::BufRead::lines(stdout)
        .map_while(Result::ok)
        .any(|line| line == CRASH_CHILD_READY);
    assert!(ready, "the crashing agent never pinned its programs");
    crashed.0.kill().unwrap();
    crashed.0.wait().unwrap();
    let stale_id = std::fs::metadata(pin_dir.join(ringlet_ebpf::EVENTS_MAP)).map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.ino()
    });

    let (tx, mut hints) = mpsc::channel(16);
    let options = EbpfOptions {
        pods_cgroup: parent.clone(),
        ring_buffer_bytes: 1 << 16,
        pin_dir: pin_dir.clone(),
    };
    let handle = start(options, tx, |_| {}).unwrap();
    let fresh_id = std::fs::metadata(pin_dir.join(ringlet_ebpf::EVENTS_MAP)).map(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.ino()
    });
    assert_ne!(
        stale_id.unwrap(),
        fresh_id.unwrap(),
        "the stale pin was not replaced"
    );
    std::fs::create_dir_all(parent.join(format!("pod{UID}")).join(container_id(7))).unwrap();
    collect(&mut hints, |seen| {
        pod_hint(seen, HintKind::CgroupCreated).is_some()
    })
    .await;
    drop(handle);
    assert!(!pin_dir.exists());
}

#[tokio::test]
async fn an_oom_kill_is_reported_for_the_victims_container() {
    let Some(root) = require() else { return };
    let Setup {
        handle,
        mut hints,
        parent,
        _pins,
        _cgroups,
        ..
    } = setup(&root, "oom", 1 << 16, 1024);
    let id = container_id(9);
    let pod = parent.join(format!("pod{UID}"));
    let container = pod.join(&id);
    std::fs::create_dir_all(&container).unwrap();
    let limit = (32_u64 << 20).to_string();
    let mut procs = vec![container.join("cgroup.procs")];
    // On a hybrid host the memory controller lives in cgroup v1; on a pure v2 host in the tree itself.
    let memory_v1 = PathBuf::from("/sys/fs/cgroup/memory");
    let _memory = if memory_v1.join("memory.limit_in_bytes").exists() {
        let dir = memory_v1.join(format!("ringlet-test-oom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let guard = CgroupTree(dir.clone());
        std::fs::write(dir.join("memory.limit_in_bytes"), &limit).unwrap();
        procs.push(dir.join("cgroup.procs"));
        Some(guard)
    } else {
        for dir in [root.as_path(), parent.as_path(), pod.as_path()] {
            std::fs::write(dir.join("cgroup.subtree_control"), "+memory").unwrap();
        }
        std::fs::write(container.join("memory.max"), &limit).unwrap();
        let _ = std::fs::write(container.join("memory.swap.max"), "0");
        None
    };
    // tail buffers a line that never ends until the OOM killer picks it.
    let status = run_in(&procs, &["sh", "-c", "head -c 1000000000 /dev/zero | tail"]).unwrap();
    assert!(
        !status.success(),
        "the memory hog was not killed: {status:?}"
    );

    let seen = collect(&mut hints, |seen| {
        pod_hint(seen, HintKind::OomKilled).is_some()
    })
    .await;
    let oom = pod_hint(&seen, HintKind::OomKilled).unwrap();
    assert_eq!(oom.pod, PodUid::new(UID));
    assert_eq!(oom.container, Some(ContainerId::new(id)));
    drop(handle);
}

#[tokio::test]
async fn a_pods_cgroup_outside_cgroup2_is_refused_before_anything_is_pinned() {
    if require().is_none() {
        return;
    }
    let not_a_cgroup = tempfile::tempdir().unwrap();
    let pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/ringlet-test-refused-{}",
        std::process::id()
    ));
    let _pins = PinDir(pin_dir.clone());
    let (tx, _hints) = mpsc::channel(1);
    let options = EbpfOptions {
        pods_cgroup: not_a_cgroup.path().join("kubepods"),
        ring_buffer_bytes: 1 << 16,
        pin_dir: pin_dir.clone(),
    };
    let error = start(options, tx, |_| {}).unwrap_err();
    assert!(
        matches!(error, ringlet::ebpf::EbpfError::NotCgroup2 { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("cgroup2"), "{error}");
    assert!(!pin_dir.exists());
}

/// What the crashing child prints once its programs are loaded and pinned.
const CRASH_CHILD_READY: &str = "crash-child: pinned";

/// The crashed agent's side: starts the hint source on the given cgroup and pin directory, says so,
/// and waits to be killed.
fn run_until_killed(dirs: &str) -> ! {
    let Some((parent, pin_dir)) = dirs.split_once('\n') else {
        panic!("{CRASH_CHILD_ENV} names no parent cgroup and pin directory: {dirs:?}")
    };
    std::fs::create_dir_all(parent)
        .unwrap_or_else(|e| panic!("crash child: creating {parent}: {e}"));
    let (tx, _hints) = mpsc::channel(16);
    let options = EbpfOptions {
        pods_cgroup: PathBuf::from(parent),
        ring_buffer_bytes: 1 << 16,
        pin_dir: PathBuf::from(pin_dir),
    };
    let _handle = start(options, tx, |_| {}).unwrap_or_else(|e| panic!("crash child: {e:?}"));
    println!("{CRASH_CHILD_READY}");
    loop {
        std::thread::park();
    }
}

/// SIGKILLs and reaps a child process on drop, so a failed assertion leaves no agent behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
