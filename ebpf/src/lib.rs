//! ringlet's BPF programs (`ringlet.bpf.c`, C compiled by clang with CO-RE relocations), embedded as
//! an ELF object for the loader in `ringlet::ebpf`, and the Rust mirror of the one kernel/user ABI,
//! the ring-buffer record declared in `ringlet_event.h`. No kubelet counterpart: this is what
//! replaces the periodic relist as the PLEG's source of change.

/// Aligns the embedded object: the ELF parser reads its headers in place.
#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

static OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/ringlet.bpf.o")));

/// The compiled BPF object (ELF, with BTF), 8-byte aligned.
pub fn object() -> &'static [u8] {
    &OBJECT.0
}

/// The programs in the object: (program name, tracepoint it attaches to as `tp_btf`).
pub const PROGRAMS: [(&str, &str); 5] = [
    ("ringlet_mkdir", "cgroup_mkdir"),
    ("ringlet_rmdir", "cgroup_rmdir"),
    ("ringlet_exec", "sched_process_exec"),
    ("ringlet_exit", "sched_process_exit"),
    ("ringlet_oom", "mark_victim"),
];

/// The program the loader may go without (its tracepoint signature changed in 6.8).
pub const OPTIONAL_PROGRAM: &str = "ringlet_oom";

/// Map names.
pub const EVENTS_MAP: &str = "ringlet_events";
pub const DROPS_MAP: &str = "ringlet_drops";
pub const PODS_CGROUP_MAP: &str = "ringlet_pods_cg";
pub const STARTED_MAP: &str = "ringlet_started";
/// Every map the object defines, in the order they are pinned.
pub const MAPS: [&str; 4] = [EVENTS_MAP, DROPS_MAP, PODS_CGROUP_MAP, STARTED_MAP];

/// Read-only globals the loader sets before the programs are verified.
pub const GLOBAL_PODS_CGROUP_ID: &str = "pods_cgroup_id";
pub const GLOBAL_PODS_CGROUP_LEVEL: &str = "pods_cgroup_level";

/// `RINGLET_PATH_LEN`.
pub const PATH_LEN: usize = 192;

/// `enum ringlet_event_kind`.
pub const EVENT_CGROUP_MKDIR: u32 = 1;
pub const EVENT_CGROUP_RMDIR: u32 = 2;
pub const EVENT_EXEC: u32 = 3;
pub const EVENT_EXIT: u32 = 4;
pub const EVENT_OOM_VICTIM: u32 = 5;

/// `struct ringlet_event`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent {
    pub kind: u32,
    pub tgid: u32,
    pub cgroup_id: u64,
    pub ktime_ns: u64,
    pub pid: u32,
    pub exit_status: u32,
    pub path: [u8; PATH_LEN],
}

const _: () = assert!(core::mem::size_of::<RawEvent>() == 32 + PATH_LEN);
const _: () = assert!(core::mem::offset_of!(RawEvent, kind) == 0);
const _: () = assert!(core::mem::offset_of!(RawEvent, tgid) == 4);
const _: () = assert!(core::mem::offset_of!(RawEvent, cgroup_id) == 8);
const _: () = assert!(core::mem::offset_of!(RawEvent, ktime_ns) == 16);
const _: () = assert!(core::mem::offset_of!(RawEvent, pid) == 24);
const _: () = assert!(core::mem::offset_of!(RawEvent, exit_status) == 28);
const _: () = assert!(core::mem::offset_of!(RawEvent, path) == 32);

impl RawEvent {
    /// Size of one record in the ring buffer.
    pub const SIZE: usize = core::mem::size_of::<Self>();

    /// Decodes one ring-buffer record (native byte order, as the kernel wrote it); `None` when the
    /// record is shorter than the struct.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..Self::SIZE)?;
        let field = |at: usize, out: &mut [u8]| out.copy_from_slice(&bytes[at..at + out.len()]);
        let u32_at = |at: usize| {
            let mut raw = [0; 4];
            field(at, &mut raw);
            u32::from_ne_bytes(raw)
        };
        let u64_at = |at: usize| {
            let mut raw = [0; 8];
            field(at, &mut raw);
            u64::from_ne_bytes(raw)
        };
        let mut path = [0; PATH_LEN];
        field(32, &mut path);
        Some(Self {
            kind: u32_at(0),
            tgid: u32_at(4),
            cgroup_id: u64_at(8),
            ktime_ns: u64_at(16),
            pid: u32_at(24),
            exit_status: u32_at(28),
            path,
        })
    }

    /// The path up to its NUL, when it is UTF-8 (cgroup paths the kubelet and runc create are).
    pub fn path(&self) -> Option<&str> {
        let end = self.path.iter().position(|&b| b == 0).unwrap_or(PATH_LEN);
        std::str::from_utf8(&self.path[..end]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_an_aligned_bpf_elf() {
        let object = object();
        assert_eq!(object.as_ptr().align_offset(8), 0);
        assert_eq!(&object[..4], b"\x7fELF");
        // e_machine 247 is EM_BPF.
        assert_eq!(u16::from_ne_bytes([object[18], object[19]]), 247);
    }

    #[test]
    fn the_c_header_declares_what_the_mirror_assumes() {
        let header = include_str!("ringlet_event.h");
        assert!(header.contains(&format!("#define RINGLET_PATH_LEN {PATH_LEN}")));
        for (name, value) in [
            ("RINGLET_EVENT_CGROUP_MKDIR", EVENT_CGROUP_MKDIR),
            ("RINGLET_EVENT_CGROUP_RMDIR", EVENT_CGROUP_RMDIR),
            ("RINGLET_EVENT_EXEC", EVENT_EXEC),
            ("RINGLET_EVENT_EXIT", EVENT_EXIT),
            ("RINGLET_EVENT_OOM_VICTIM", EVENT_OOM_VICTIM),
        ] {
            assert!(header.contains(&format!("{name} = {value},")), "{name}");
        }
        let fields: Vec<&str> = header
            .lines()
            .filter_map(|line| {
                line.trim()
                    .strip_prefix("__u")
                    .or_else(|| line.trim().strip_prefix("char "))
            })
            .collect();
        assert_eq!(fields.len(), 7, "{fields:?}");
    }

    #[test]
    fn decodes_a_record_field_by_field() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&EVENT_EXIT.to_ne_bytes());
        bytes.extend_from_slice(&42_u32.to_ne_bytes());
        bytes.extend_from_slice(&0x1122_3344_5566_7788_u64.to_ne_bytes());
        bytes.extend_from_slice(&99_u64.to_ne_bytes());
        bytes.extend_from_slice(&43_u32.to_ne_bytes());
        bytes.extend_from_slice(&(3_u32 << 8).to_ne_bytes());
        let mut path = [0_u8; PATH_LEN];
        path[..9].copy_from_slice(b"/kubepods");
        bytes.extend_from_slice(&path);
        let event = RawEvent::from_bytes(&bytes).unwrap();
        assert_eq!(event.kind, EVENT_EXIT);
        assert_eq!(event.tgid, 42);
        assert_eq!(event.cgroup_id, 0x1122_3344_5566_7788);
        assert_eq!(event.ktime_ns, 99);
        assert_eq!(event.pid, 43);
        assert_eq!(event.exit_status, 3 << 8);
        assert_eq!(event.path(), Some("/kubepods"));
        assert_eq!(RawEvent::from_bytes(&bytes[..RawEvent::SIZE - 1]), None);
    }
}
