//! Choosing and starting the I/O engine (`--io-engine=auto|uring|epoll`).
//!
//! No kubelet counterpart (Go's runtime owns the poller there). Both engines run the agent on one
//! thread: a tokio current-thread runtime whose futures run inside a `LocalSet`, so `!Send` tasks
//! ([`spawn_connection`](super::spawn_connection)), `tokio::spawn`, tokio timers and tokio's own
//! sockets work the same way on both. The uring engine adds the tokio-uring driver to that runtime.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use super::probe::{self, RING_ENTRIES, UringUnavailable};

/// The configured engine choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoEngineSetting {
    /// `io_uring` when the probe passes, epoll otherwise.
    #[default]
    Auto,
    /// `io_uring` or nothing: the agent refuses to start when `io_uring` is unavailable.
    Uring,
    /// Always epoll.
    Epoll,
}

impl IoEngineSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            IoEngineSetting::Auto => "auto",
            IoEngineSetting::Uring => "uring",
            IoEngineSetting::Epoll => "epoll",
        }
    }
}

impl FromStr for IoEngineSetting {
    type Err = EngineError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "auto" => Ok(IoEngineSetting::Auto),
            "uring" => Ok(IoEngineSetting::Uring),
            "epoll" => Ok(IoEngineSetting::Epoll),
            _ => Err(EngineError::InvalidSetting {
                value: value.to_owned(),
            }),
        }
    }
}

impl fmt::Display for IoEngineSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The engine the agent runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    Uring,
    Epoll,
}

impl IoEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            IoEngine::Uring => "uring",
            IoEngine::Epoll => "epoll",
        }
    }
}

impl fmt::Display for IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid io engine {value:?}: expected one of auto, uring, epoll")]
    InvalidSetting { value: String },
    #[error("io engine uring was requested but cannot be used")]
    UringUnavailable(#[source] UringUnavailable),
    #[error("could not start the {engine} runtime")]
    Runtime {
        engine: IoEngine,
        #[source]
        source: std::io::Error,
    },
}

/// Resolves the setting to an engine. With `auto`, a fallback to epoll comes with the reason `io_uring`
/// was not usable (for one log line); `uring` fails with that reason instead.
pub fn select(setting: IoEngineSetting) -> Result<(IoEngine, Option<String>), EngineError> {
    match setting {
        IoEngineSetting::Epoll => Ok((IoEngine::Epoll, None)),
        IoEngineSetting::Uring => {
            probe::probe().map_err(EngineError::UringUnavailable)?;
            Ok((IoEngine::Uring, None))
        }
        IoEngineSetting::Auto => match probe::probe() {
            Ok(()) => Ok((IoEngine::Uring, None)),
            Err(reason) => Ok((IoEngine::Epoll, Some(reason.to_string()))),
        },
    }
}

/// Runs `future` to completion on a fresh single-threaded runtime of `engine`, inside a `LocalSet`.
/// Tasks still running when `future` completes are dropped with the runtime.
pub fn block_on<F: Future>(engine: IoEngine, future: F) -> Result<F::Output, EngineError> {
    let runtime_error = |source| EngineError::Runtime { engine, source };
    match engine {
        IoEngine::Uring => {
            // `tokio_uring::start` panics when the ring cannot be set up; building the runtime
            // ourselves turns that into an error.
            let runtime = tokio_uring::Runtime::new(tokio_uring::builder().entries(RING_ENTRIES))
                .map_err(runtime_error)?;
            Ok(runtime.block_on(future))
        }
        IoEngine::Epoll => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(runtime_error)?;
            let local = tokio::task::LocalSet::new();
            Ok(local.block_on(&runtime, future))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn settings_parse_and_print() {
        for setting in [
            IoEngineSetting::Auto,
            IoEngineSetting::Uring,
            IoEngineSetting::Epoll,
        ] {
            assert_eq!(
                setting.as_str().parse::<IoEngineSetting>().unwrap(),
                setting
            );
        }
        let err = "io_uring".parse::<IoEngineSetting>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid io engine \"io_uring\": expected one of auto, uring, epoll"
        );
        assert!("".parse::<IoEngineSetting>().is_err());
        assert!("Uring".parse::<IoEngineSetting>().is_err());
    }

    #[test]
    fn selects_uring_where_available() {
        assert_eq!(
            select(IoEngineSetting::Auto).unwrap(),
            (IoEngine::Uring, None)
        );
        assert_eq!(
            select(IoEngineSetting::Uring).unwrap(),
            (IoEngine::Uring, None)
        );
        assert_eq!(
            select(IoEngineSetting::Epoll).unwrap(),
            (IoEngine::Epoll, None)
        );
    }

    #[test]
    fn both_engines_run_local_tasks_and_timers() {
        for engine in [IoEngine::Uring, IoEngine::Epoll] {
            let out = block_on(engine, async {
                let shared = Rc::new(7);
                let local = tokio::task::spawn_local({
                    let shared = Rc::clone(&shared);
                    async move { *shared * 6 }
                });
                let sent = tokio::spawn(async { 1 });
                tokio::time::sleep(Duration::from_millis(1)).await;
                local.await.unwrap() + sent.await.unwrap()
            })
            .unwrap();
            assert_eq!(out, 43, "{engine}");
        }
    }

    const SECCOMP_CHILD: &str = "RINGLET_IO_SECCOMP_CHILD";

    /// Runs in a child process whose seccomp filter answers `io_uring_setup` with EPERM (see
    /// `falls_back_to_epoll_when_seccomp_denies_io_uring`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore = "helper: runs only as the child of falls_back_to_epoll_when_seccomp_denies_io_uring"]
    fn seccomp_child() {
        assert_eq!(std::env::var(SECCOMP_CHILD).as_deref(), Ok("1"));
        let (engine, reason) = select(IoEngineSetting::Auto).unwrap();
        assert_eq!(engine, IoEngine::Epoll);
        let reason = reason.unwrap();
        assert!(
            reason.contains("denied") && reason.contains("seccomp"),
            "{reason}"
        );
        let err = select(IoEngineSetting::Uring).unwrap_err();
        assert!(matches!(
            err,
            EngineError::UringUnavailable(UringUnavailable::Denied { .. })
        ));
        assert_eq!(block_on(engine, async { 5 }).unwrap(), 5);
        println!("seccomp child: fell back: {reason}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(
        unsafe_code,
        reason = "the test installs a seccomp filter in its child"
    )]
    fn falls_back_to_epoll_when_seccomp_denies_io_uring() {
        let mut child = Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--ignored",
                "--exact",
                "io::engine::tests::seccomp_child",
                "--nocapture",
            ])
            .env(SECCOMP_CHILD, "1");
        // SAFETY: the closure runs between fork and exec and only makes two syscalls (prctl), which
        // are async-signal-safe; the filter it installs lives on the stack for the duration of the call.
        unsafe { child.pre_exec(deny_io_uring_setup) };
        let output = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("seccomp child: fell back"), "{stdout}");
    }

    #[cfg(target_arch = "x86_64")]
    /// Installs a seccomp filter that makes `io_uring_setup` fail with EPERM and allows everything else.
    #[allow(
        unsafe_code,
        reason = "prctl with a filter program has no safe wrapper here"
    )]
    fn deny_io_uring_setup() -> std::io::Result<()> {
        // Classic BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K.
        const LOAD: u16 = 0x20;
        const JUMP_EQ: u16 = 0x15;
        const RETURN: u16 = 0x06;
        // Offsets of `arch` and `nr` in `struct seccomp_data`.
        const ARCH_OFFSET: u32 = 4;
        const NR_OFFSET: u32 = 0;
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        let statement = |code, k| libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        };
        let jump = |k, jt, jf| libc::sock_filter {
            code: JUMP_EQ,
            jt,
            jf,
            k,
        };
        let deny = libc::SECCOMP_RET_ERRNO | u32::try_from(libc::EPERM).unwrap_or(1);
        let mut filter = [
            statement(LOAD, ARCH_OFFSET),
            // Another architecture (a 32-bit syscall): leave it alone.
            jump(AUDIT_ARCH_X86_64, 0, 3),
            statement(LOAD, NR_OFFSET),
            jump(
                u32::try_from(libc::SYS_io_uring_setup).unwrap_or(u32::MAX),
                0,
                1,
            ),
            statement(RETURN, deny),
            statement(RETURN, libc::SECCOMP_RET_ALLOW),
        ];
        let program = libc::sock_fprog {
            len: u16::try_from(filter.len()).unwrap_or(0),
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: plain prctl calls; `program` and `filter` outlive them.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &raw const program,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
