//! The eBPF hint source: loads ringlet's BPF programs (package `ringlet-ebpf`) with aya, attaches
//! them to the cgroup, sched and oom tracepoints, pins maps and links under a bpffs directory for
//! inspection, and runs the ring-buffer reader that turns kernel events into PLEG hints. The kubelet
//! has no counterpart (its Evented PLEG took events from the runtime instead).
//!
//! Kernel requirements (the probe and the loader name whichever is missing): BTF
//! (`/sys/kernel/btf/vmlinux`), BPF ring buffers (5.8), `tp_btf` programs (5.5), bpffs for the pins,
//! root or `CAP_BPF` + `CAP_PERFMON`. The pods' parent must be a cgroup2 directory (on a hybrid host
//! the one under `/sys/fs/cgroup/unified`, where runc creates every container cgroup too), and the
//! agent must see the host's cgroup namespace. Per kernel version:
//! - before 5.11 BPF memory counts against `RLIMIT_MEMLOCK`, which is then raised;
//! - before 6.2 a cgroup keeps `ancestor_ids[]` instead of `ancestors[]`; the programs read
//!   whichever exists (CO-RE `bpf_core_field_exists`);
//! - before 6.8 `mark_victim` passes only a pid, so the OOM program does not load: the loader logs
//!   it and runs without it (an OOM kill then shows as a death by SIGKILL);
//! - `sched_process_exit` has a `group_dead` argument on recent kernels (6.18 here), not on older
//!   ones; the program reads `task->signal->live` instead, which means the same on every kernel.
//!
//! So 5.10 runs everything but the OOM program (not tested here: this machine runs 6.18).

mod hint_source;
mod paths;
mod reader;

use std::fs::File;
use std::io;
use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{CgroupArray, Map, MapData, MapError, MapType, PerCpuArray, RingBuf};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{BtfTracePoint, ProgramError, ProgramType};
use aya::{Btf, BtfError, EbpfLoader};
use nix::fcntl::{Flock, FlockArg};
use rustix::event::{EventfdFlags, eventfd};
use tokio::sync::mpsc;

use crate::mountinfo;
use crate::pleg::{Hint, HintSourceCheck};

pub use hint_source::{HintSource, start_hint_source};
pub use paths::{CgroupOwner, CgroupOwners, parse_cgroup_path};
pub use reader::decode;

/// Where the kernel exposes its own BTF.
const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";
/// `statfs` magic numbers.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// The default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ringlet";
/// The default ring-buffer size: about 4,600 events.
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;

/// What went wrong setting up the eBPF hint source; each message names what is missing.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(
        "the kernel has no BTF: {path} is missing (needs a kernel built with CONFIG_DEBUG_INFO_BTF=y)"
    )]
    NoKernelBtf { path: PathBuf },
    #[error("reading the kernel BTF from {path}")]
    KernelBtf {
        path: PathBuf,
        #[source]
        source: BtfError,
    },
    #[error("the kernel does not support BPF ring buffers (BPF_MAP_TYPE_RINGBUF needs Linux 5.8)")]
    NoRingBuffer,
    #[error("probing the kernel for {what} (needs root, or CAP_BPF and CAP_PERFMON)")]
    Probe {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("tracepoint {tracepoint} is missing: the kernel BTF has no btf_trace_{tracepoint}")]
    MissingTracepoint { tracepoint: &'static str },
    #[error(
        "the ring buffer size {bytes} must be a power of two and a multiple of the page size {page_size}"
    )]
    RingBufferSize { bytes: u32, page_size: u64 },
    #[error("{path} is not on a bpf filesystem (mount one: `mount -t bpf bpf /sys/fs/bpf`)")]
    NoBpffs { path: PathBuf },
    #[error("the host mounts no cgroup2 hierarchy (the programs identify pods by cgroup2 ids)")]
    NoCgroup2Mount,
    #[error("the pin directory {path} is in use by another ringlet{holder}")]
    PinsInUse { path: PathBuf, holder: String },
    #[error(
        "{path} is not in a mounted cgroup2 hierarchy (/proc/self/mountinfo lists no cgroup2 mount above it)"
    )]
    NotCgroup2 { path: PathBuf },
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("raising RLIMIT_MEMLOCK (this kernel charges BPF memory to it)")]
    Memlock {
        #[source]
        source: io::Error,
    },
    #[error("loading the BPF object (needs root, or CAP_BPF and CAP_PERFMON)")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("the BPF object has no {what} named {name}")]
    MissingInObject {
        what: &'static str,
        name: &'static str,
    },
    #[error("loading program {name} for tracepoint {tracepoint}")]
    Program {
        name: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("setting up map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
    #[error("pinning {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: Box<aya::pin::PinError>,
    },
    #[error("{what} for the ring-buffer reader")]
    Reader {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// How to run the eBPF hint source.
#[derive(Clone, Debug)]
pub struct EbpfOptions {
    /// The pods' parent cgroup in the cgroup2 tree (`/sys/fs/cgroup/unified/kubepods` on a hybrid
    /// host, `/sys/fs/cgroup/kubepods` or `.../kubepods.slice` on a pure cgroup2 host). Created
    /// when missing: the programs need its id before the first pod exists.
    pub pods_cgroup: PathBuf,
    /// Ring-buffer size in bytes: a power of two, at least one page.
    pub ring_buffer_bytes: u32,
    /// The bpffs directory maps and links are pinned in.
    pub pin_dir: PathBuf,
}

impl EbpfOptions {
    /// The defaults for a pods' parent cgroup.
    pub fn new(pods_cgroup: PathBuf) -> Self {
        Self {
            pods_cgroup,
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
        }
    }
}

/// Counters the reader keeps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub events_read: AtomicU64,
    pub hints_lost: AtomicU64,
    pub resyncs: AtomicU64,
}

/// The running hint source. Dropping it stops the reader (and waits for its thread), detaches the
/// programs and removes the pins.
pub struct EbpfHandle {
    // Fields drop in order: the reader stops before the programs and pins go.
    reader: reader::ReaderThread,
    pins: Pins,
    drops: Arc<PerCpuArray<MapData, u64>>,
    counters: Arc<Counters>,
    attached: Vec<&'static str>,
    // Holds the loaded programs; the links above keep them attached.
    _ebpf: aya::Ebpf,
    // Released last, once the pins are gone.
    _pin_lock: Flock<File>,
}

impl std::fmt::Debug for EbpfHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfHandle")
            .field("pin_dir", &self.pins.dir)
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

impl EbpfHandle {
    /// Ring-buffer reservations that failed in the kernel (events lost), summed over CPUs.
    pub fn dropped_events(&self) -> u64 {
        read_drops(&self.drops)
    }

    /// Events the reader took off the ring buffer.
    pub fn events_read(&self) -> u64 {
        self.counters.events_read.load(Ordering::Relaxed)
    }

    /// Hints not sent because the hint channel was full (each run of them became one resync).
    pub fn hints_lost(&self) -> u64 {
        self.counters.hints_lost.load(Ordering::Relaxed)
    }

    /// Resync hints sent.
    pub fn resyncs(&self) -> u64 {
        self.counters.resyncs.load(Ordering::Relaxed)
    }

    /// The programs attached (the OOM program is missing on kernels before 6.8).
    pub fn attached_programs(&self) -> &[&'static str] {
        &self.attached
    }

    /// The directory maps and links are pinned in.
    pub fn pin_dir(&self) -> &Path {
        &self.pins.dir
    }

    /// Makes the reader read the drop counter now (the PLEG asks at every full relist).
    pub fn source_check(&self) -> HintSourceCheck {
        self.reader.check()
    }
}

/// What is pinned in the pin directory; removed on drop, so a start that fails half-way leaves
/// nothing attached and a clean shutdown leaves no pins.
struct Pins {
    dir: PathBuf,
    maps: Vec<PathBuf>,
    links: Vec<PinnedLink>,
}

impl Drop for Pins {
    fn drop(&mut self) {
        for link in self.links.drain(..) {
            // Unpinning removes the file; dropping the returned link detaches the program.
            if let Err(error) = link.unpin() {
                tracing::warn!(%error, "removing a pinned BPF link");
            }
        }
        for path in &self.maps {
            if let Err(error) = std::fs::remove_file(path) {
                tracing::warn!(%error, path = %path.display(), "removing a pinned BPF map");
            }
        }
        if let Err(error) = std::fs::remove_dir(&self.dir) {
            tracing::debug!(%error, path = %self.dir.display(), "removing the BPF pin directory");
        }
    }
}

fn read_drops(drops: &PerCpuArray<MapData, u64>) -> u64 {
    drops.get(&0, 0).map_or(0, |values| values.iter().sum())
}

/// Checks that this kernel has BTF and ring buffers. Whether it can load and attach BTF tracepoint
/// programs (and has each tracepoint) shows when each program loads: aya's generic probe for
/// tracing programs needs an attach target and fails with EPERM even for root. Returns the parsed
/// kernel BTF.
pub fn probe() -> Result<Btf, EbpfError> {
    let path = PathBuf::from(KERNEL_BTF);
    if !path.exists() {
        return Err(EbpfError::NoKernelBtf { path });
    }
    let btf = Btf::from_sys_fs().map_err(|source| EbpfError::KernelBtf { path, source })?;
    match aya::sys::is_map_supported(MapType::RingBuf) {
        Ok(true) => {}
        Ok(false) => return Err(EbpfError::NoRingBuffer),
        Err(source) => {
            return Err(EbpfError::Probe {
                what: "ring buffer support",
                source: Box::new(source),
            });
        }
    }
    Ok(btf)
}

/// Loads, attaches and pins the programs and starts the ring-buffer reader on its own thread, which
/// sends one hint per kernel event on `hints` (and `Hint::Resync` when events were lost) and gives
/// `on_drops` the kernel's drop counter (events lost, summed over CPUs) every time it reads it: on
/// each wake-up and each [`EbpfHandle::source_check`] request. `on_drops` runs on the reader
/// thread, so it must be quick.
pub fn start(
    options: EbpfOptions,
    hints: mpsc::Sender<Hint>,
    on_drops: impl FnMut(u64) + Send + 'static,
) -> Result<EbpfHandle, EbpfError> {
    let page_size = page_size();
    let bytes = options.ring_buffer_bytes;
    if !bytes.is_power_of_two() || u64::from(bytes) < page_size || u64::from(bytes) % page_size != 0
    {
        return Err(EbpfError::RingBufferSize { bytes, page_size });
    }
    let btf = probe()?;
    check_bpffs(&options.pin_dir)?;
    raise_memlock_if_needed()?;

    let pods_cgroup = options.pods_cgroup;
    let pods = pods_cgroup.as_path();
    std::fs::create_dir_all(pods)
        .map_err(|source| io_error("creating the pods' parent cgroup", pods, source))?;
    let pods_dir = File::open(pods)
        .map_err(|source| io_error("opening the pods' parent cgroup", pods, source))?;
    let pods_id = pods_dir
        .metadata()
        .map_err(|source| io_error("reading the pods' parent cgroup", pods, source))?
        .ino();
    let level = cgroup2_level(pods)?;

    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .override_global(ringlet_ebpf::GLOBAL_PODS_CGROUP_ID, &pods_id, true)
        .override_global(ringlet_ebpf::GLOBAL_PODS_CGROUP_LEVEL, &level, true)
        .map_max_entries(ringlet_ebpf::EVENTS_MAP, bytes)
        .load(ringlet_ebpf::object())
        .map_err(|source| EbpfError::Load {
            source: Box::new(source),
        })?;

    {
        let map = map_mut(&mut ebpf, ringlet_ebpf::PODS_CGROUP_MAP)?;
        let mut array =
            CgroupArray::try_from(map).map_err(|e| map_error(ringlet_ebpf::PODS_CGROUP_MAP, e))?;
        array
            .set(0, pods_dir.as_fd(), 0)
            .map_err(|e| map_error(ringlet_ebpf::PODS_CGROUP_MAP, e))?;
    }

    let pin_lock = lock_pin_dir(&options.pin_dir)?;
    clear_stale_pins(&options.pin_dir)?;
    let mut pins = Pins {
        dir: options.pin_dir,
        maps: Vec::new(),
        links: Vec::new(),
    };
    pin_maps(&ebpf, &mut pins)?;
    let attached = attach_all(&mut ebpf, &btf, &mut pins)?;

    let events_map = take_map(&mut ebpf, ringlet_ebpf::EVENTS_MAP)?;
    let ring = RingBuf::try_from(events_map).map_err(|e| map_error(ringlet_ebpf::EVENTS_MAP, e))?;
    let drops_map = take_map(&mut ebpf, ringlet_ebpf::DROPS_MAP)?;
    let drops = Arc::new(
        PerCpuArray::try_from(drops_map).map_err(|e| map_error(ringlet_ebpf::DROPS_MAP, e))?,
    );

    // The reader thread scans the tree first thing, off the caller's (async) thread.
    let owners = CgroupOwners::new(pods.to_path_buf());
    let counters = Arc::new(Counters::default());
    let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|errno| {
        EbpfError::Reader {
            what: "creating an eventfd",
            source: errno.into(),
        }
    })?;
    let reader = reader::ReaderThread::spawn(
        reader::Reader {
            ring,
            drops: Arc::clone(&drops),
            on_drops: Box::new(on_drops),
            owners,
            hints,
            counters: Arc::clone(&counters),
        },
        wake,
    )
    .map_err(|source| EbpfError::Reader {
        what: "starting a thread",
        source,
    })?;
    tracing::info!(
        pods_cgroup = %pods.display(),
        pods_cgroup_id = pods_id,
        level,
        pin_dir = %pins.dir.display(),
        programs = ?attached,
        "eBPF hint source running"
    );
    drop(btf);
    release_freed_heap();
    Ok(EbpfHandle {
        reader,
        pins,
        drops,
        counters,
        attached,
        _ebpf: ebpf,
        _pin_lock: pin_lock,
    })
}

/// Hands the heap the loader freed back to the kernel: parsing the kernel's BTF for the CO-RE
/// relocations takes tens of MiB, which glibc would otherwise keep and the agent's RSS would show
/// for its whole life.
fn release_freed_heap() {
    crate::sys::malloc_trim();
}

fn pin_maps(ebpf: &aya::Ebpf, pins: &mut Pins) -> Result<(), EbpfError> {
    for name in ringlet_ebpf::MAPS {
        let path = pins.dir.join(name);
        let map = ebpf
            .map(name)
            .ok_or(EbpfError::MissingInObject { what: "map", name })?;
        map.pin(&path).map_err(|source| EbpfError::Pin {
            path: path.clone(),
            source: Box::new(source),
        })?;
        pins.maps.push(path);
    }
    Ok(())
}

/// Loads and attaches every program and pins its link; only the OOM program may fail (logged).
fn attach_all(
    ebpf: &mut aya::Ebpf,
    btf: &Btf,
    pins: &mut Pins,
) -> Result<Vec<&'static str>, EbpfError> {
    let mut attached = Vec::new();
    for (name, tracepoint) in ringlet_ebpf::PROGRAMS {
        match attach(ebpf, btf, name, tracepoint) {
            Ok(link) => {
                let path = pins.dir.join(name);
                let pinned = link.pin(&path).map_err(|source| EbpfError::Pin {
                    path,
                    source: Box::new(source),
                })?;
                pins.links.push(pinned);
                attached.push(name);
            }
            Err(error) if name == ringlet_ebpf::OPTIONAL_PROGRAM => {
                tracing::warn!(
                    error = %crate::error_chain::error_chain(&error),
                    "OOM victims are not reported from the kernel (mark_victim needs its 6.8 signature); \
                     OOM kills still show as deaths by SIGKILL"
                );
            }
            Err(error) => return Err(error),
        }
    }
    Ok(attached)
}

fn attach(
    ebpf: &mut aya::Ebpf,
    btf: &Btf,
    name: &'static str,
    tracepoint: &'static str,
) -> Result<FdLink, EbpfError> {
    let program_error = |source| EbpfError::Program {
        name,
        tracepoint,
        source: Box::new(source),
    };
    let program: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or(EbpfError::MissingInObject {
            what: "program",
            name,
        })?
        .try_into()
        .map_err(program_error)?;
    program
        .load(tracepoint, btf)
        .map_err(|source| match source {
            ProgramError::Btf(BtfError::UnknownBtfTypeName { .. }) => {
                EbpfError::MissingTracepoint { tracepoint }
            }
            source => program_error(source),
        })?;
    let id = program.attach().map_err(program_error)?;
    Ok(program.take_link(id).map_err(program_error)?.into())
}

fn map_mut<'a>(ebpf: &'a mut aya::Ebpf, name: &'static str) -> Result<&'a mut Map, EbpfError> {
    ebpf.map_mut(name)
        .ok_or(EbpfError::MissingInObject { what: "map", name })
}

fn take_map(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<Map, EbpfError> {
    ebpf.take_map(name)
        .ok_or(EbpfError::MissingInObject { what: "map", name })
}

fn map_error(name: &'static str, source: MapError) -> EbpfError {
    EbpfError::Map {
        name,
        source: Box::new(source),
    }
}

fn io_error(what: &'static str, path: &Path, source: io::Error) -> EbpfError {
    EbpfError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn page_size() -> u64 {
    u64::try_from(rustix::param::page_size()).unwrap_or(4096)
}

/// The pin directory must be on bpffs; it may not exist yet, so the nearest existing ancestor is
/// checked.
fn check_bpffs(pin_dir: &Path) -> Result<(), EbpfError> {
    let existing = pin_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let is_bpffs = statfs_type(existing)
        .map_err(|source| io_error("checking the file system of", existing, source))?
        == BPF_FS_MAGIC;
    if is_bpffs {
        Ok(())
    } else {
        Err(EbpfError::NoBpffs {
            path: existing.to_path_buf(),
        })
    }
}

fn statfs_type(path: &Path) -> io::Result<i64> {
    let stat = rustix::fs::statfs(path)?;
    #[allow(
        clippy::useless_conversion,
        reason = "f_type's width differs between architectures"
    )]
    Ok(i64::from(stat.f_type))
}

/// How often taking the pin directory is tried when it keeps being removed under the lock.
const PIN_LOCK_ATTEMPTS: usize = 3;

/// Takes the pin directory for this agent: an exclusive `flock` on the directory, held until the
/// handle drops, so a second agent on the machine cannot remove the first one's pins as stale.
/// An agent that stops removes the directory while still holding its lock, so a lock taken on a
/// directory opened just before that removal locks nothing anyone else looks at (the next agent
/// creates and locks a new directory); the lock counts only when the path still names the locked
/// directory, and is taken again otherwise.
fn lock_pin_dir(pin_dir: &Path) -> Result<Flock<File>, EbpfError> {
    for _ in 0..PIN_LOCK_ATTEMPTS {
        std::fs::create_dir_all(pin_dir)
            .map_err(|source| io_error("creating the pin directory", pin_dir, source))?;
        let dir = File::open(pin_dir)
            .map_err(|source| io_error("opening the pin directory", pin_dir, source))?;
        let inode = dir.metadata().map(|m| m.ino()).ok();
        let locked = Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            if errno == nix::errno::Errno::EWOULDBLOCK {
                EbpfError::PinsInUse {
                    path: pin_dir.to_path_buf(),
                    holder: inode
                        .and_then(lock_holder)
                        .map(|pid| format!(" (pid {pid})"))
                        .unwrap_or_default(),
                }
            } else {
                io_error("locking the pin directory", pin_dir, errno.into())
            }
        })?;
        if names_same_file(pin_dir, &locked) {
            return Ok(locked);
        }
        tracing::debug!(path = %pin_dir.display(), "the pin directory was removed while being locked; locking it again");
    }
    Err(io_error(
        "locking the pin directory",
        pin_dir,
        io::Error::other(format!(
            "it was removed and re-created under the lock {PIN_LOCK_ATTEMPTS} times in a row"
        )),
    ))
}

/// Whether `path` still names the open `file` (same device and inode).
fn names_same_file(path: &Path, file: &File) -> bool {
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}

/// The pid holding a `flock` on the file with `inode`, from `/proc/locks`.
fn lock_holder(inode: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 1234 00:1d:5678 0 EOF`: pid, then major:minor:inode.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (pid, device_inode) = (fields.get(4)?, fields.get(5)?);
        let locked_inode: u64 = device_inode.rsplit(':').next()?.parse().ok()?;
        (fields.get(1) == Some(&"FLOCK") && locked_inode == inode)
            .then(|| pid.parse().ok())
            .flatten()
    })
}

/// Removes whatever a crashed run left in the pin directory: its pinned links keep old programs
/// attached until the pins go.
fn clear_stale_pins(pin_dir: &Path) -> Result<(), EbpfError> {
    std::fs::create_dir_all(pin_dir)
        .map_err(|source| io_error("creating the pin directory", pin_dir, source))?;
    let entries = std::fs::read_dir(pin_dir)
        .map_err(|source| io_error("listing the pin directory", pin_dir, source))?;
    for entry in entries.flatten() {
        let path = entry.path();
        tracing::info!(path = %path.display(), "removing a stale BPF pin from an earlier run");
        std::fs::remove_file(&path)
            .map_err(|source| io_error("removing the stale pin", &path, source))?;
    }
    Ok(())
}

/// Kernels before 5.11 charge BPF maps and programs to `RLIMIT_MEMLOCK`; later ones to the memory
/// cgroup. `bpf_ktime_get_coarse_ns` arrived in the same release, so its presence says which
/// (libbpf decides the same way).
fn raise_memlock_if_needed() -> Result<(), EbpfError> {
    let memcg_accounting = aya::sys::is_helper_supported(
        ProgramType::SocketFilter,
        aya::sys::BpfHelper::BPF_FUNC_ktime_get_coarse_ns,
    )
    .unwrap_or(false);
    if memcg_accounting {
        return Ok(());
    }
    let unlimited = rustix::process::Rlimit {
        current: None,
        maximum: None,
    };
    rustix::process::setrlimit(rustix::process::Resource::Memlock, unlimited).map_err(|errno| {
        EbpfError::Memlock {
            source: errno.into(),
        }
    })?;
    tracing::info!("raised RLIMIT_MEMLOCK: this kernel charges BPF memory to it");
    Ok(())
}

/// The cgroup's depth below the cgroup2 root (the root is level 0), from the cgroup2 mount the path
/// is on and that mount's root in the hierarchy.
fn cgroup2_level(path: &Path) -> Result<u32, EbpfError> {
    let table = std::fs::read_to_string(mountinfo::PATH)
        .map_err(|source| io_error("reading", Path::new(mountinfo::PATH), source))?;
    let canonical = path
        .canonicalize()
        .map_err(|source| io_error("resolving", path, source))?;
    level_from_mountinfo(&table, &canonical).ok_or_else(|| EbpfError::NotCgroup2 {
        path: path.to_path_buf(),
    })
}

fn level_from_mountinfo(table: &str, path: &Path) -> Option<u32> {
    let mounts = mountinfo::parse(table);
    let (root, rest) = mounts
        .iter()
        .filter(|mount| mount.is_cgroup2())
        .filter_map(|mount| {
            let rest = path.strip_prefix(&mount.mount_point).ok()?;
            Some((mount.mount_point.as_os_str().len(), &mount.root, rest))
        })
        .max_by_key(|(len, ..)| *len)
        .map(|(_, root, rest)| (root, rest))?;
    let depth = root
        .join(rest)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count();
    u32::try_from(depth).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 25 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
34 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 30 0:31 /kubepods/pod1 /mnt/inner rw - cgroup2 cgroup2 rw
";

    #[test]
    fn levels_count_from_the_hierarchy_root() {
        let level = |p: &str| level_from_mountinfo(MOUNTINFO, Path::new(p));
        assert_eq!(level("/sys/fs/cgroup/unified/kubepods"), Some(1));
        assert_eq!(level("/sys/fs/cgroup/unified/kubepods/besteffort"), Some(2));
        assert_eq!(level("/sys/fs/cgroup/unified"), Some(0));
        // A mount of a sub-tree counts that sub-tree's depth too.
        assert_eq!(level("/mnt/inner/x"), Some(3));
        // cgroup v1 hierarchies do not count.
        assert_eq!(level("/sys/fs/cgroup/memory/kubepods"), None);
        assert_eq!(level("/tmp"), None);
    }

    /// The pin-directory lock needs no BPF: a plain directory shows it. (The privileged tests
    /// `agent/tests/ebpf_kernel.rs::a_second_agent_on_live_pins_is_refused_naming_the_holder` and
    /// `tests/tests/ebpf_pleg.rs::a_second_agent_leaves_the_first_ones_pins_alone` show it on live
    /// pins.)
    #[test]
    fn a_second_lock_on_the_pin_directory_is_refused_naming_the_holder() {
        let root = tempfile::tempdir().unwrap();
        let pin_dir = root.path().join("ringlet");
        let held = lock_pin_dir(&pin_dir).unwrap();
        match lock_pin_dir(&pin_dir) {
            Err(EbpfError::PinsInUse { path, holder }) => {
                assert_eq!(path, pin_dir);
                assert_eq!(holder, format!(" (pid {})", std::process::id()));
            }
            other => panic!("expected PinsInUse, got {other:?}"),
        }
        drop(held);
        assert!(
            lock_pin_dir(&pin_dir).is_ok(),
            "free once the holder is gone"
        );
    }

    #[test]
    fn a_lock_on_a_removed_pin_directory_locks_nothing() {
        let root = tempfile::tempdir().unwrap();
        let pin_dir = root.path().join("ringlet");
        std::fs::create_dir(&pin_dir).unwrap();
        // An agent opened the directory just before the agent stopping removed it...
        let opened = File::open(&pin_dir).unwrap();
        std::fs::remove_dir(&pin_dir).unwrap();
        // ...and the next agent made a new one.
        std::fs::create_dir(&pin_dir).unwrap();
        let stale = Flock::lock(opened, FlockArg::LockExclusiveNonblock).unwrap();
        assert!(
            !names_same_file(&pin_dir, &stale),
            "locking the removed directory must not count"
        );
        let live = lock_pin_dir(&pin_dir).unwrap();
        assert!(names_same_file(&pin_dir, &live));
        drop(stale);
    }

    #[test]
    fn ring_buffer_sizes_are_checked_before_anything_is_loaded() {
        let (tx, _rx) = mpsc::channel(1);
        let options = EbpfOptions {
            ring_buffer_bytes: 5000,
            ..EbpfOptions::new(PathBuf::from("/nonexistent"))
        };
        assert!(matches!(
            start(options, tx, |_| {}),
            Err(EbpfError::RingBufferSize { bytes: 5000, .. })
        ));
    }
}
