//! The `io_uring` availability probe behind `--io-engine=auto|uring`.
//!
//! No kubelet counterpart: the upstream kubelet always runs on Go's epoll netpoller. The probe sets up
//! a ring of the size the uring engine uses and asks the kernel (`IORING_REGISTER_PROBE`) whether every
//! operation the engine submits is supported, so that `auto` can fall back to epoll up front instead of
//! failing on the first socket or file operation.

use std::io;

use io_uring::{IoUring, Probe, opcode};

/// Submission-queue entries of the engine's ring; the probe sets up a ring of the same size so that a
/// locked-memory limit that is too small for the real ring is caught here.
pub(crate) const RING_ENTRIES: u32 = 256;

/// The `io_uring` operations the engine's adapters submit (tokio-uring sockets, listener and files), by
/// the name an operator finds in `io_uring_enter(2)`.
const REQUIRED_OPCODES: [(&str, u8); 6] = [
    ("IORING_OP_ACCEPT", opcode::Accept::CODE),
    ("IORING_OP_CONNECT", opcode::Connect::CODE),
    ("IORING_OP_READ", opcode::Read::CODE),
    ("IORING_OP_WRITE", opcode::Write::CODE),
    ("IORING_OP_OPENAT", opcode::OpenAt::CODE),
    ("IORING_OP_STATX", opcode::Statx::CODE),
];

const DISABLED_SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";
const GROUP_SYSCTL: &str = "/proc/sys/kernel/io_uring_group";

/// Why the `io_uring` engine cannot run on this machine, worded for the operator who reads the log line.
#[derive(Debug, thiserror::Error)]
pub enum UringUnavailable {
    #[error(
        "io_uring is not available: io_uring_setup returned ENOSYS (kernel older than 5.1, kernel built \
         without CONFIG_IO_URING, or a seccomp profile that answers ENOSYS)"
    )]
    NotSupported,
    #[error("io_uring is disabled on this machine by the sysctl kernel.io_uring_disabled={value}")]
    Disabled { value: u8 },
    #[error(
        "io_uring is denied: kernel.io_uring_disabled=1 allows it only to processes with CAP_SYS_ADMIN \
         or in the group kernel.io_uring_group={group}, and this process is neither"
    )]
    GroupRestricted { group: String },
    #[error(
        "io_uring is denied: io_uring_setup returned EPERM while kernel.io_uring_disabled={sysctl}; a \
         seccomp filter or security module blocks it (container runtimes' default seccomp profiles do)"
    )]
    Denied { sysctl: String },
    #[error(
        "io_uring ring setup ran out of locked memory (ENOMEM): RLIMIT_MEMLOCK is {soft} (hard {hard}); \
         raise it, e.g. LimitMEMLOCK= in the systemd unit"
    )]
    Memlock { soft: String, hard: String },
    #[error("could not set up an io_uring ring of {entries} entries")]
    Setup {
        entries: u32,
        #[source]
        source: io::Error,
    },
    #[error(
        "could not list the kernel's io_uring operations (IORING_REGISTER_PROBE needs Linux 5.6 or newer)"
    )]
    Probe {
        #[source]
        source: io::Error,
    },
    #[error(
        "the kernel's io_uring lacks the {name} operation the engine uses (Linux 5.6 or newer has it)"
    )]
    MissingOpcode { name: &'static str },
}

/// Checks that `io_uring` can be used here: a ring can be set up and supports every operation the engine
/// submits.
pub fn probe() -> Result<(), UringUnavailable> {
    let ring = IoUring::new(RING_ENTRIES).map_err(setup_error)?;
    let mut supported = Probe::new();
    ring.submitter()
        .register_probe(&mut supported)
        .map_err(|source| UringUnavailable::Probe { source })?;
    missing_opcode(|code| supported.is_supported(code))
        .map_or(Ok(()), |name| Err(UringUnavailable::MissingOpcode { name }))
}

/// The first required operation that `is_supported` rejects.
fn missing_opcode(is_supported: impl Fn(u8) -> bool) -> Option<&'static str> {
    REQUIRED_OPCODES
        .iter()
        .find(|(_, code)| !is_supported(*code))
        .map(|(name, _)| *name)
}

fn setup_error(source: io::Error) -> UringUnavailable {
    match source.raw_os_error() {
        Some(libc::ENOSYS) => UringUnavailable::NotSupported,
        Some(libc::EPERM) => permission_error(
            read_sysctl(DISABLED_SYSCTL).as_deref(),
            read_sysctl(GROUP_SYSCTL),
        ),
        Some(libc::ENOMEM) => {
            let (soft, hard) = memlock_limit();
            UringUnavailable::Memlock { soft, hard }
        }
        _ => UringUnavailable::Setup {
            entries: RING_ENTRIES,
            source,
        },
    }
}

/// Tells apart the reasons `io_uring_setup` answers EPERM: the machine-wide switch, its group
/// restriction, or (with the switch open) a seccomp filter or LSM.
fn permission_error(disabled: Option<&str>, group: Option<String>) -> UringUnavailable {
    match disabled {
        Some("2") => UringUnavailable::Disabled { value: 2 },
        Some("1") => UringUnavailable::GroupRestricted {
            group: group.unwrap_or_else(|| "unknown".to_owned()),
        },
        Some(other) => UringUnavailable::Denied {
            sysctl: other.to_owned(),
        },
        None => UringUnavailable::Denied {
            sysctl: "unknown (sysctl not readable)".to_owned(),
        },
    }
}

fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|value| value.trim().to_owned())
}

/// The soft and hard `RLIMIT_MEMLOCK`, in words.
fn memlock_limit() -> (String, String) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    (describe_limit(limit.current), describe_limit(limit.maximum))
}

/// `None` is `RLIM_INFINITY`.
fn describe_limit(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |limit| format!("{limit} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_uring_is_usable_on_this_machine() {
        probe().unwrap();
    }

    #[test]
    fn names_the_first_missing_operation() {
        assert_eq!(missing_opcode(|_| true), None);
        assert_eq!(
            missing_opcode(|code| code != opcode::OpenAt::CODE),
            Some("IORING_OP_OPENAT")
        );
    }

    #[test]
    fn eperm_is_explained_by_the_sysctl() {
        let disabled = permission_error(Some("2"), Some("-1".into()));
        assert!(matches!(disabled, UringUnavailable::Disabled { value: 2 }));
        assert!(disabled.to_string().contains("kernel.io_uring_disabled=2"));

        let group = permission_error(Some("1"), Some("1234".into()));
        assert!(
            group.to_string().contains("kernel.io_uring_group=1234"),
            "{group}"
        );

        let seccomp = permission_error(Some("0"), None);
        assert!(seccomp.to_string().contains("seccomp"), "{seccomp}");
        assert!(
            seccomp.to_string().contains("kernel.io_uring_disabled=0"),
            "{seccomp}"
        );
    }

    #[test]
    fn setup_errors_map_to_operator_reasons() {
        assert!(matches!(
            setup_error(io::Error::from_raw_os_error(libc::ENOSYS)),
            UringUnavailable::NotSupported
        ));
        let memlock = setup_error(io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(memlock.to_string().contains("RLIMIT_MEMLOCK"), "{memlock}");
        assert!(matches!(
            setup_error(io::Error::from_raw_os_error(libc::EINVAL)),
            UringUnavailable::Setup {
                entries: RING_ENTRIES,
                ..
            }
        ));
    }
}
